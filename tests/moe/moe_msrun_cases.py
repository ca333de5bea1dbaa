"""Cases of the shared MoE msrun job (see conftest.py's `moe_msrun_results`), per test file."""
EXPERT_PARALLEL_CASES = ["2x2x1+place", "1x2x2+bits+overlap", "2x2x1+deepseek", "1x2x2+gptoss"]
HIERARCHICAL_CASES = ["1x4x1+hier", "1x4x1+hier+tiny", "1x4x1+tiny"]
# moe_pipeline_msrun_worker.py's cases on 4 processes, named with this prefix in the job
PIPELINE_PREFIX = "pipeline:"
PIPELINE_CASES = ["1f1b+expert", "zb_h1+expert+hier"]
