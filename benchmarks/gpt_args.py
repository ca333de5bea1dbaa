"""Command-line options shared by the simulation-overhead benchmarks (ours and the torch peer),
so both always measure the same GPT-style model."""
import argparse


def add_gpt_model_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--layers --hidden --heads --seq --vocab: examples/models.py's GPT, defaulting to the issue's model."""
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    return parser


def gpt_argument_parser(description: str) -> argparse.ArgumentParser:
    """The GPT's options (`add_gpt_model_arguments`) and --batch --repeat."""
    parser = add_gpt_model_arguments(argparse.ArgumentParser(description=description))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="timed steps after one warm-up step")
    return parser
