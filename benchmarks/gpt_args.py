"""Command-line options shared by the simulation-overhead benchmarks (ours and the torch peer),
so both always measure the same GPT-style model."""
import argparse


def gpt_argument_parser(description: str) -> argparse.ArgumentParser:
    """--layers --hidden --heads --seq --batch --vocab --repeat, defaulting to the issue's model."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="timed steps after one warm-up step")
    return parser
