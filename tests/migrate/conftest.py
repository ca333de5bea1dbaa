"""The migration tests' marker: `sweep` (the transformers family sweep, opt-in: MIGRATE_SWEEP=named|all)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "sweep: the transformers family sweep beyond the fast subset (opt-in: set "
                                       "MIGRATE_SWEEP=named or all)")
