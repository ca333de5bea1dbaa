"""Names of generated files: the snake_case stem of a class name."""
import re

__all__ = ["module_file_name"]


def module_file_name(class_name: str) -> str:
    """snake_case file stem of a class name: GPT2LMHeadModel -> gpt2_lm_head_model."""
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", class_name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", words).lower()
