"""The `mindspore-hyper` parser: subcommands plug in by a module with add_parser(subparsers) that
sets func=run; the top level needs a command; --version."""
import sys
import types

from cli_run import cli, cli_script

import mindspore_hyper
from mindspore_hyper import cli as cli_package


def test_no_command_exits_2():
    code, _, err = cli()
    assert code == 2 and "a COMMAND is required" in err and "estimate" in err


def test_top_level_help_and_version():
    code, out, _ = cli("--help")
    assert code == 0 and all(name in out for name in ("estimate", "plan", "tune"))
    code, out, _ = cli("--version")
    assert code == 0 and mindspore_hyper.__version__ in out


def test_the_installed_script_runs_and_exits_2_on_bad_flags():
    code, out, _ = cli_script("estimate", "--preset", "gpt-example")
    assert code == 0 and "stage  layers" in out
    code, _, err = cli_script("estimate", "--preset", "gpt-example", "--zero", "5")
    assert code == 2 and "argument --zero: invalid choice: 5" in err


def test_python_dash_m_runs_the_same_cli():
    import subprocess

    result = subprocess.run([sys.executable, "-m", "mindspore_hyper.cli", "estimate", "--preset", "gpt-example"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "stage  layers" in result.stdout


def test_a_module_with_add_parser_plugs_in(monkeypatch, capsys):
    module = types.ModuleType("hello_subcommand")

    def run(args):
        print(f"hello {args.name}")
        return 0

    def add_parser(subparsers):
        p = subparsers.add_parser("hello", help="greet")
        p.add_argument("--name", required=True)
        p.set_defaults(func=run, parser=p)
        return p

    module.add_parser = add_parser
    monkeypatch.setitem(sys.modules, "hello_subcommand", module)
    monkeypatch.setattr(cli_package, "SUBCOMMANDS", cli_package.SUBCOMMANDS + ("hello_subcommand",))
    assert cli_package.main(["hello", "--name", "lead"]) == 0
    assert capsys.readouterr().out == "hello lead\n"


def test_every_subcommand_sets_its_run():
    parser = cli_package.build_parser()
    for argv, module in ((["estimate", "--preset", "gpt-example"], "estimate"), (["plan", "--data", "2"], "plan"),
                         (["tune", "block-size"], "tune")):
        args = parser.parse_args(argv)
        assert args.func is sys.modules[f"mindspore_hyper.cli.{module}"].run
