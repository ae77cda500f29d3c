"""Model kinds, tasks, experiments, Hugging Face families and CLI verbs register one way: a
module of their package registers itself, and the package's listing finds it. Each test writes
one new module into a folder added to the package's path, changes nothing else, and checks that
the thing is found, listed in its place and used."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from attnlab.registry import Registry


@pytest.fixture
def new_module(tmp_path, monkeypatch):
    """add(package, name, source): ``source`` becomes module ``package.name`` (in a folder added
    to the package's ``__path__``); what it registered is forgotten afterwards."""
    added: list[tuple[Registry, str, str]] = []

    def add(package: str, name: str, source: str, registry: Registry, key: str) -> None:
        folder = tmp_path / package.replace(".", "_")
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        pkg = importlib.import_module(package)
        monkeypatch.setattr(pkg, "__path__", [*pkg.__path__, str(folder)])
        added.append((registry, key, f"{package}.{name}"))

    yield add
    for registry, key, module in added:
        registry.found.pop(key, None)
        sys.modules.pop(module, None)


def test_a_verb_is_one_module_listed_in_its_place_and_run(new_module, capsys):
    from attnlab import cli

    new_module("attnlab.cli", "hello", """
        from attnlab.cli import Verb, register

        def hello(args):
            print(f"hello {args.name}")
            return 0

        def add(sub):
            p = sub.add_parser("hello", help="say hello")
            p.add_argument("name")
            p.set_defaults(func=hello)

        VERB = register(Verb("hello", 105, add, runs="nothing"))
    """, cli.VERBS, "hello")  # fmt: skip
    names = list(cli.registered())
    assert names.index("check") < names.index("hello") < names.index("import-hf")
    listing = cli.build_parser().format_help()
    assert listing.index("check ") < listing.index("hello") < listing.index("import-hf")
    assert cli.main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"


def test_verbs_have_distinct_places_and_modules_named_after_them():
    from attnlab import cli

    verbs = cli.registered()
    assert len({v.order for v in verbs.values()}) == len(verbs)
    for name, verb in verbs.items():
        module = sys.modules[verb.add.__module__].__name__
        assert module == "attnlab.cli." + name.replace("-", "_"), (name, module)


def test_a_model_kind_is_one_module(new_module):
    from attnlab.models import declare
    from attnlab.rundir import model_class

    new_module("attnlab.models", "wide_gpt", """
        from attnlab.models.declare import register
        from attnlab.models.gpt import GPT

        @register
        class WideGPT(GPT):
            model_type = "wide-gpt"
    """, declare.KINDS, "wide-gpt")  # fmt: skip
    assert model_class("wide-gpt").__name__ == "WideGPT"
    assert "wide-gpt" in declare.registered() and "gpt" in declare.registered()


def test_a_task_is_one_module_and_train_offers_it(new_module):
    from attnlab.cli import build_parser, verbs
    from attnlab.tasks import base

    new_module("attnlab.tasks", "echo", """
        from attnlab.tasks.base import register
        from attnlab.tasks.lm import LanguageModel

        @register
        class Echo(LanguageModel):
            name = "echo"
            order = 15
            label = "--task echo"
    """, base.TASKS, "echo")  # fmt: skip
    assert list(base.registered())[:3] == ["lm", "echo", "mlm"]
    assert base.task_class("echo").label == "--task echo"
    train = verbs(build_parser())["train"]
    task = next(a for a in train._actions if a.dest == "task")
    assert list(task.choices)[:3] == ["lm", "echo", "mlm"]


def test_an_experiment_is_one_module_listed_and_run(new_module, tmp_path):
    from attnlab.cli import build_parser, verbs
    from attnlab.experiments import recipe, run_experiment

    new_module("attnlab.experiments", "hello_experiment", """
        from attnlab.experiments.recipe import Experiment, register
        from attnlab.experiments.report import Report

        def recipe(ctx):
            return Report("hello", "Hello", "nobody 2025", "nothing measured", claims=[])

        EXPERIMENT = register(Experiment("hello", "Hello?", "says hello", "nobody 2025", recipe,
                                         order=25, about="nobody 2025 (a greeting)"))
    """, recipe.EXPERIMENTS, "hello")  # fmt: skip
    names = list(recipe.registry())
    assert (
        names.index("rollout-and-flow")
        < names.index("hello")
        < names.index("attention-vs-importance")
    )
    p = verbs(build_parser())["experiment"]
    assert "hello: nobody 2025 (a greeting)." in " ".join(p.description.split())
    assert run_experiment("hello", tmp_path / "out", seeds=[1]).name == "hello"
    assert (tmp_path / "out" / "figures.json").is_file()


def test_a_family_is_one_module_that_import_hf_reads(new_module, tmp_path):
    import json

    from attnlab.cli import build_parser
    from attnlab.interop import hf

    new_module("attnlab.interop", "tiny_family", """
        from attnlab.interop.hf import Family, register

        def load(hf_dir, hf):
            raise RuntimeError(f"tiny loads {hf['model_type']}")

        FAMILY = register(Family("tiny", 60, "Tiny", ("tiny_lm",), load))
    """, hf.FAMILIES, "tiny")  # fmt: skip
    assert list(hf.loaders())[-1] == "tiny_lm"
    assert "Tiny)" in " ".join(build_parser().format_help().split())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "tiny_lm"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(RuntimeError, match="tiny loads tiny_lm"):
        hf.load_hf(tmp_path)


def test_a_name_registered_twice_is_refused():
    registry = Registry("attnlab.cli")

    class A:
        name = "a"

    class B:
        name = "a"

    assert registry.register(A) is A and registry.register(A) is A  # the same class again
    with pytest.raises(TypeError, match="registered twice"):
        registry.register(B)
