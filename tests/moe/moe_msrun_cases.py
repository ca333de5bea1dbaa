"""Cases of the shared MoE msrun job (see conftest.py's `moe_msrun_results`), per test file."""
EXPERT_PARALLEL_CASES = ["2x2x1+place", "1x2x2+bits+overlap"]
HIERARCHICAL_CASES = ["1x4x1+hier", "1x4x1+hier+tiny", "1x4x1+tiny"]
