"""`python -m mindspore_hyper.migrate convert ...` (the same subcommand the package CLI registers)."""
import argparse
import sys

from mindspore_hyper.migrate.cli import add_parser


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindspore_hyper.migrate",
                                     description="PyTorch -> MindSpore migration")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="command")
    add_parser(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
