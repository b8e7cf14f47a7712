"""Entry-point discovery: broken plugins are isolated, strict mode is fatal, allow/block lists, lazy import.

The plugins here are real distributions (a dist-info folder with METADATA and entry_points.txt on a path that
importlib.metadata scans), not mocks of the discovery code.
"""

from __future__ import annotations

import sys
import textwrap
import types
import uuid
import warnings

import pytest

import samplechain
from samplechain import PluginHost, PluginLoadError, PluginWarning, UnknownPluginError
from samplechain.contracts import PluginClass
from samplechain.engine.discovery import KIND_BASES, metadata
from samplechain.errors import PluginError

GOOD = """
import attrs
import samplechain as sc

class Shift(sc.Sampler):
    name = "{sampler}"
    stage = sc.Stage.TRANSFORM
    def apply(self, cand, ctx):
        return cand.replace_logits(cand.logits + 1.0)

@sc.hookimpl
def register_samplers(register):
    register(Shift)
"""


@pytest.fixture
def site(tmp_path, monkeypatch, clean_env):
    """A folder acting as site-packages: make_plugin() drops a module and its dist-info there."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def make_plugin(ep_name: str, source: str, dist: str | None = None, version: str = "1.2.3") -> str:
        module = f"plug_{ep_name}_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        dist = dist or f"samplechain-{ep_name.replace('_', '-')}"
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[samplechain]\n{ep_name} = {module}\n")
        made.append(module)
        return module

    def entry_points(with_installed: bool = True):
        fake = [
            ep
            for d in metadata.distributions(path=[str(tmp_path)])
            for ep in d.entry_points
            if ep.group == "samplechain"
        ]
        real = list(metadata.entry_points(group="samplechain")) if with_installed else []
        return real + fake

    make_plugin.entry_points = entry_points
    yield make_plugin
    for m in made:
        sys.modules.pop(m, None)


def test_plugin_module_is_imported_only_when_a_chain_needs_it(site):
    module = site("shift", GOOD.format(sampler="shift"))
    host = PluginHost(entry_points=site.entry_points())
    assert module not in sys.modules
    assert host.plugins["shift"].status == "available"
    samplechain.Chain.load({"samplers": [{"use": "shift"}, {"use": "greedy"}]}, host=host)
    assert module in sys.modules
    assert host.plugins["shift"].status == "loaded"
    assert host.plugins["shift"].provides == ["shift.v1"]
    assert host.plugins["top_p"].status == "available"  # not needed, not imported


def test_plugin_failing_at_import_is_reported_and_the_rest_keep_working(site):
    site("exploding", "raise RuntimeError('boom at import')\n", dist="samplechain-exploding", version="0.9")
    site("shift", GOOD.format(sampler="shift"))
    host = PluginHost(entry_points=site.entry_points())
    with pytest.warns(PluginWarning) as caught:
        infos = {i.name: i for i in host.load_all()}
    text = str(caught[0].message)
    assert "'exploding'" in text and "samplechain-exploding 0.9" in text and "boom at import" in text
    assert infos["exploding"].status == "broken"
    assert "RuntimeError: boom at import" in infos["exploding"].error
    assert infos["shift"].status == "loaded" and infos["top_k"].status == "loaded"
    chain = samplechain.Chain.load(
        {"samplers": [{"use": "shift"}, {"use": "top_k", "k": 2}, {"use": "greedy"}]}, host=host
    )
    import torch

    assert chain.sample(torch.tensor([[0.0, 3.0, 1.0]])).token_ids.tolist() == [1]


def test_strict_mode_makes_a_broken_plugin_fatal(site):
    site("exploding", "raise RuntimeError('boom at import')\n")
    host = PluginHost(entry_points=site.entry_points(), strict=True)
    with pytest.raises(PluginLoadError, match=r"plugin 'exploding' \(samplechain-exploding 1.2.3\).*boom"):
        host.load_all()


def test_strict_mode_still_answers_an_unknown_name_with_did_you_mean(site):
    """Searching every plugin for an unlisted name must not turn into an error about an unrelated broken one."""
    site("exploding", "raise RuntimeError('boom at import')\n")
    host = PluginHost(entry_points=site.entry_points(), strict=True)
    with pytest.warns(PluginWarning, match="exploding"):
        with pytest.raises(UnknownPluginError) as err:
            host.get("sampler", "top_pp")
    text = str(err.value)
    assert "did you mean 'top_p' (from samplechain-top-p)" in text
    assert "plugin 'exploding'" in text and "is broken" in text and "boom at import" in text
    with pytest.raises(PluginLoadError, match="strict mode"):  # naming the broken plugin itself stays fatal
        PluginHost(entry_points=site.entry_points(), strict=True).get("sampler", "exploding")


def test_strict_mode_from_the_environment(site, monkeypatch):
    site("exploding", "raise RuntimeError('boom')\n")
    monkeypatch.setenv("SAMPLECHAIN_STRICT", "1")
    host = PluginHost(entry_points=site.entry_points())
    with pytest.raises(PluginLoadError):
        host.load("exploding")


def test_misspelled_hook_is_caught_by_check_pending(site):
    site(
        "typo",
        """
        import samplechain as sc
        @sc.hookimpl
        def register_sampler(register):   # missing the s
            pass
    """,
    )
    host = PluginHost(entry_points=site.entry_points())
    with pytest.warns(PluginWarning, match="register_sampler"):
        info = host.load("typo")
    assert info.status == "broken"
    assert "register_sampler" in info.error


def test_registering_something_that_is_not_a_sampler_names_the_plugin(site):
    site(
        "notasampler",
        """
        import samplechain as sc
        @sc.hookimpl
        def register_samplers(register):
            register(dict)
    """,
    )
    host = PluginHost(entry_points=site.entry_points())
    with pytest.warns(PluginWarning):
        info = host.load("notasampler")
    assert info.status == "broken"
    assert "plugin 'notasampler'" in info.error and "subclass of Sampler" in info.error


@pytest.mark.parametrize("kind", sorted(KIND_BASES))
def test_a_class_of_any_kind_without_a_name_is_refused_naming_it(kind):
    """Every kind's base class is a PluginClass, whose `name` is empty: a subclass that sets none goes by its class's
    name in messages, and registering it is one error naming the plugin and the class."""
    base = KIND_BASES[kind]
    unnamed = type("Unnamed", (base,), {"stage": samplechain.Stage.TRANSFORM} if kind == "sampler" else {})
    assert issubclass(base, PluginClass) and unnamed.qualified_name() == "Unnamed.v1"

    def register_them(register):
        register(unnamed)

    hook = {"sampler": "samplers", "stopping_criterion": "stopping_criteria"}.get(kind, f"{kind}s")
    plugin = types.ModuleType("unnamed_plugin")
    setattr(plugin, f"register_{hook}", samplechain.hookimpl(register_them))
    host = PluginHost(use_env=False)
    with pytest.raises(PluginError, match=r"plugin 'unnamed-test': Unnamed\.name = '': must be a lowercase identifier"):
        host.register_plugin(plugin, name="unnamed-test")
    assert host.pm.get_plugin("unnamed-test") is None  # nothing of it stays registered


def test_two_plugins_registering_the_same_name_conflict_loudly(site):
    site("one", GOOD.format(sampler="same"))
    site("two", GOOD.format(sampler="same"))
    host = PluginHost(entry_points=site.entry_points())
    with pytest.warns(PluginWarning, match="registered by both plugin 'one' and plugin 'two'") as caught:
        host.load_all()
    text = str(caught[0].message)  # either may be the one not wanted: both are named for the block list
    assert "SAMPLECHAIN_BLOCK_PLUGINS=one or SAMPLECHAIN_BLOCK_PLUGINS=two" in text
    assert host.plugins["one"].status == "loaded"
    assert host.plugins["two"].status == "broken"


def test_allow_list_unset_means_all(site):
    host = PluginHost(entry_points=site.entry_points())
    assert all(i.status == "available" for i in host.plugins.values())


def test_allow_list_empty_means_none(site, monkeypatch):
    monkeypatch.setenv("SAMPLECHAIN_PLUGINS", "")
    host = PluginHost(entry_points=site.entry_points())
    assert {i.status for i in host.plugins.values()} == {"disabled"}
    with pytest.raises(UnknownPluginError, match="disabled: not in SAMPLECHAIN_PLUGINS"):
        host.get("sampler", "top_p")


def test_allow_list_names_exactly_the_plugins_to_load(site, monkeypatch):
    monkeypatch.setenv("SAMPLECHAIN_PLUGINS", "greedy, cpu")
    host = PluginHost(entry_points=site.entry_points())
    enabled = {n for n, i in host.plugins.items() if i.status == "available"}
    assert enabled == {"greedy", "cpu"}
    samplechain.Chain.load({"samplers": [{"use": "greedy"}]}, host=host)
    with pytest.raises(samplechain.ConfigError, match="top_k"):
        samplechain.Chain.load({"samplers": [{"use": "top_k", "k": 3}, {"use": "greedy"}]}, host=host)


def test_block_list_keeps_a_plugin_out(site, monkeypatch):
    module = site("shift", GOOD.format(sampler="shift"))
    monkeypatch.setenv("SAMPLECHAIN_BLOCK_PLUGINS", "shift")
    host = PluginHost(entry_points=site.entry_points())
    assert host.plugins["shift"].status == "blocked"
    with pytest.raises(UnknownPluginError, match="blocked"):
        host.get("sampler", "shift")
    assert module not in sys.modules


def test_versioned_names_pin_a_version(site):
    site("shift", GOOD.format(sampler="shift"))
    site("shift2", GOOD.format(sampler="shift").replace('name = "shift"', 'name = "shift"\n    version = 2'))
    host = PluginHost(entry_points=site.entry_points())
    host.load_all()
    assert host.get("sampler", "shift").version == 2  # unversioned = newest
    assert host.get("sampler", "shift.v1").version == 1
    with pytest.raises(UnknownPluginError, match=r"shift.v3 is not installed; installed versions: shift.v1, shift.v2"):
        host.get("sampler", "shift.v3")


def test_in_process_plugin_objects_register_through_the_same_manager():
    host = PluginHost(use_env=False)

    class Local:
        @samplechain.hookimpl
        def register_samplers(self, register):
            from samplechain import Sampler, Stage

            class Neg(Sampler):
                name = "negate_for_test"
                stage = Stage.TRANSFORM

                def apply(self, cand, ctx):
                    return cand.replace_logits(-cand.logits)

            register(Neg)

    assert host.register_plugin(Local(), name="local-test") == ["negate_for_test.v1"]
    assert host.pm.get_plugin("local-test") is not None  # a named plugin, never an id()
    import torch

    chain = samplechain.Chain.load({"samplers": [{"use": "negate_for_test"}, {"use": "greedy"}]}, host=host)
    assert chain.sample(torch.tensor([[0.0, -2.0, 1.0]])).token_ids.tolist() == [1]


def test_no_warning_when_every_plugin_is_healthy(clean_env):
    host = PluginHost()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        host.load_all()
    assert {i.status for i in host.plugins.values()} == {"loaded"}


DRAFTER = """
import samplechain as sc
from samplechain.drafters import Drafter

class Echo(Drafter):
    name = "echo"
    def propose(self, row, tokens, limit):
        return tokens[-1:]

@sc.hookimpl
def register_drafters(register):
    register(Echo)
"""


def test_drafters_register_through_the_same_entry_points_and_a_broken_one_is_isolated(site):
    site("echo", DRAFTER)
    site("bad_drafter", "raise ImportError('no module named suffix_tree')\n", dist="samplechain-bad-drafter")
    site("lazy", DRAFTER.replace("def propose", "def unused").replace('"echo"', '"lazy"'))
    host = PluginHost(entry_points=site.entry_points())
    with pytest.warns(PluginWarning) as caught:
        infos = {i.name: i for i in host.load_all()}
    assert infos["echo"].status == "loaded" and infos["echo"].kinds == ["drafter"]
    assert infos["echo"].provides == ["echo.v1"]
    assert infos["bad_drafter"].status == "broken" and "suffix_tree" in infos["bad_drafter"].error
    assert infos["lazy"].status == "broken" and "must implement propose(row, tokens, limit)" in infos["lazy"].error
    assert any("'bad_drafter'" in str(w.message) for w in caught)
    assert host.get("drafter", "echo").name == "echo"
    assert host.get("drafter", "prompt_lookup").name == "prompt_lookup"  # the built-in keeps working
    with pytest.raises(UnknownPluginError, match=r"unknown drafter 'ecko'; did you mean 'echo'"):
        host.get("drafter", "ecko")
