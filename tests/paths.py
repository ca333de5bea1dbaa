"""Paths of the repository, for tests in any subfolder."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"
EXAMPLES = REPO_ROOT / "examples"
