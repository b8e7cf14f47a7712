"""The public surface is explicit and pinned: changing it is a deliberate act."""

import samplechain

EXPECTED = {
    "ALL_DEVICES", "Backend", "BackendError", "ChainWarning", "Candidates", "Chain", "ChainConfig", "ConfigError", "EntrySpec", "FUSED_SAMPLE", "FusedPart",
    "EosIds", "SamplerSetup", "MixedChains", "MixedStore", "token_ids_field", "NoParams", "PluginError", "PluginHost", "PluginInfo", "PluginLoadError", "PluginWarning", "Registry",
    "RequestError", "RequestStore", "SampleOutput", "Sampler", "SamplechainError", "SamplingError", "Stage",
    "StepContext", "StopContext", "StopMatch", "StopResult", "StopSetup", "Stopping", "StoppingCriterion", "UnknownPluginError", "__version__", "finite", "get_host", "hookimpl",
    "in_range", "load_config", "load_registry", "one_of", "reset_host", "seed_field", "select_backend", "token_id_list", "max_positions",
}


def test_all_is_pinned():
    assert set(samplechain.__all__) == EXPECTED


def test_every_exported_name_exists():
    for name in samplechain.__all__:
        assert hasattr(samplechain, name), name


def test_package_is_typed():
    from importlib import resources

    assert (resources.files("samplechain") / "py.typed").is_file()
