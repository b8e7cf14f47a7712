"""Chain configs: every error names the file, the key path, the bad value and what was expected."""

from __future__ import annotations

import pytest

import samplechain
from samplechain import Chain, ConfigError, load_config

BAD = [
    pytest.param(
        {"samplers": [{"use": "top_p", "p": 1.5}, {"use": "dist"}]},
        "<dict>: samplers[0].p = 1.5: must be in [0, 1]",
        id="out-of-range",
    ),
    pytest.param(
        {"samplers": [{"use": "top_k", "k": "40"}, {"use": "dist"}]},
        "<dict>: samplers[0].k = '40': expected an integer",
        id="string-for-int",
    ),
    pytest.param(
        {"samplers": [{"use": "top_k", "k": 4.5}, {"use": "dist"}]},
        "<dict>: samplers[0].k = 4.5: expected an integer",
        id="float-for-int",
    ),
    pytest.param(
        {"samplers": [{"use": "temperature", "t": True}, {"use": "dist"}]},
        "<dict>: samplers[0].t = True: expected a number",
        id="bool-for-float",
    ),
    pytest.param(
        {"samplers": [{"use": "temperature", "t": -0.5}, {"use": "dist"}]},
        "<dict>: samplers[0].t = -0.5: must be in [0, inf) (0 keeps only the most likely token)",
        id="negative-temperature",
    ),
    pytest.param(
        {"samplers": [{"use": "temperature", "t": float("nan")}, {"use": "dist"}]},
        "<dict>: samplers[0].t = nan: must be a finite number",
        id="nan",
    ),
    pytest.param(
        {"samplers": [{"use": "top_p"}, {"use": "dist"}]},
        "<dict>: samplers[0].p: required key missing",
        id="missing-parameter",
    ),
    pytest.param(
        {"samplers": [{"use": "top_p", "p": 0.9, "pp": 2}, {"use": "dist"}]},
        "<dict>: samplers[0].pp = 2: unknown parameter of top_p.v1 (valid: p, min_keep); did you mean 'p'?",
        id="unknown-parameter",
    ),
    pytest.param(
        {"samplers": [{"use": "top_q", "p": 0.9}, {"use": "dist"}]},
        "<dict>: samplers[0].use = 'top_q': unknown sampler 'top_q'; did you mean 'top_p' (from samplechain-top-p)",
        id="unknown-sampler-did-you-mean",
    ),
    pytest.param(
        {"samplers": [{"use": "softcap", "cap": 30.0}, {"use": "dist"}]},
        "<dict>: samplers[0].use = 'softcap': unknown sampler 'softcap': it is provided by distribution "
        "samplechain-example-softcap, which is not installed; pip install samplechain-example-softcap",
        id="known-but-not-installed",
    ),
    pytest.param(
        {"samplers": [{"use": "top_p.v7", "p": 0.9}, {"use": "dist"}]},
        "<dict>: samplers[0].use = 'top_p.v7': sampler top_p.v7 is not installed; installed versions: top_p.v1",
        id="unknown-version",
    ),
    pytest.param(
        {"samplers": [{"use": "Top-P"}, {"use": "dist"}]},
        "<dict>: samplers[0].use = 'Top-P': 'Top-P' is not a valid sampler name: expected lowercase `name` or `name.vN`, e.g. top_p or top_p.v1",
        id="malformed-name",
    ),
    pytest.param(
        {"samplers": [{"p": 0.9}, {"use": "dist"}]},
        "<dict>: samplers[0].use: required: the name of a sampler",
        id="missing-use",
    ),
    pytest.param(
        {"samplers": [{"use": "top_k", "k": 40}]},
        "<dict>: samplers[0].use = 'top_k': the chain must end in exactly one selector",
        id="no-selector",
    ),
    pytest.param(
        {"samplers": [{"use": "greedy"}, {"use": "top_k", "k": 40}]},
        "<dict>: samplers[0].use = 'greedy': a chain has exactly one selector and it is the last entry",
        id="selector-not-last",
    ),
    pytest.param(
        {"samplers": [{"use": "dist"}, {"use": "greedy"}]},
        "selectors found at samplers[0] (dist), samplers[1] (greedy)",
        id="two-selectors",
    ),
    pytest.param({"samplers": []}, "<dict>: chain.samplers: empty", id="empty-chain"),
    pytest.param({"backend": "cpu"}, "<dict>: samplers: required key missing", id="no-samplers"),
    pytest.param(
        {"samplers": [{"use": "greedy"}], "backnd": "cpu"},
        "<dict>: backnd = 'cpu': unknown key; expected one of samplers, stop, backend, nonfinite, name, description, draft, guards; did you "
        "mean 'backend'?",
        id="unknown-chain-key",
    ),
    pytest.param(
        {"samplers": [{"use": "temperature", "t": 1e39}, {"use": "dist"}]},
        "<dict>: samplers[0].t = 1e+39: too large for float32",
        id="float32-overflow",
    ),
    pytest.param(
        {"samplers": [{"use": "min_p", "p": 1e-50}, {"use": "dist"}]},
        "<dict>: samplers[0].p = 1e-50: too small for float32 (parameters are float32): use 0 or",
        id="float32-underflow",
    ),
    pytest.param(
        {"samplers": [{"use": "dist", "seed": 2**64}]},
        "<dict>: samplers[0].seed = 18446744073709551616: must be an integer in [0, 2**63)",
        id="seed-too-large",
    ),
    pytest.param(
        {"samplers": [{"use": "greedy"}], "backend": "tpu"},
        "<dict>: backend = 'tpu': unknown backend 'tpu'",
        id="unknown-backend",
    ),
    pytest.param(
        {"samplers": "top_k"},
        "<dict>: samplers = 'top_k': expected an array of tables",
        id="samplers-not-a-list",
    ),
    pytest.param(
        {"samplers": [{"use": "temperature", "t": 0.5}, {"use": "temperature", "t": 0.7}, {"use": "dist"}]},
        "<dict>: samplers[1].id = 'temperature': already used by samplers[0]",
        id="duplicate-ids",
    ),
    pytest.param(
        {"samplers": [{"use": "top_p", "p": 2.0}, {"use": "top_k", "k": "x"}, {"use": "dist"}]},
        "<dict>: samplers[0].p = 2.0: must be in [0, 1] (1 disables)\n<dict>: samplers[1].k = 'x': expected an integer",
        id="all-errors-at-once",
    ),
]


@pytest.mark.parametrize("config, message", BAD)
def test_bad_config_gives_one_clear_error(config, message):
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert message in str(info.value)


def test_toml_errors_name_the_file_and_the_table_path(tmp_path):
    path = tmp_path / "chain.toml"
    path.write_text(
        '[chain]\nsamplers = [\n  { use = "top_k", k = 40 },\n  { use = "top_p", p = 1.5 },\n  { use = "dist" },\n]\n'
    )
    with pytest.raises(ConfigError, match=r"chain.toml: chain.samplers\[1\].p = 1.5: must be in \[0, 1\]"):
        Chain.load(path)


def test_malformed_toml_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[chain\nsamplers = 3\n")
    with pytest.raises(ConfigError, match=r"broken.toml: not valid TOML: .*line 1"):
        Chain.load(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="chain file not found"):
        Chain.load(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (3, r"chain source = 3: expected a chain file's path, .* got int"),
        (None, r"chain source = None: .* got NoneType"),
        (b"[chain]", r"chain source = b'\[chain\]': .* got bytes"),
        ("", r"chain source = '': expected a chain file's path, a TOML string"),
        ('samplers = [{ use = "greedy" }]', r"chain file not found; a string is read as TOML text only when it has a"),
        ("greedy", r"greedy: chain file not found; for the preset of that name give 'preset:greedy'"),
    ],
)
def test_a_source_that_is_no_chain_is_one_config_error_saying_what_was_meant(source, message):
    with pytest.raises(ConfigError, match=message):
        Chain.load(source)


def test_an_unreadable_chain_file_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read the chain file: Is a directory"):
        Chain.load(tmp_path)
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"# caf\xe9\n[chain]\n")
    with pytest.raises(ConfigError, match=r"latin1.toml: not a TOML file \(not UTF-8 text: invalid"):
        Chain.load(path)


def test_a_valid_toml_file_builds_the_declared_chain_in_order(tmp_path):
    path = tmp_path / "chain.toml"
    path.write_text(
        '[chain]\nname = "mine"\nbackend = "cpu"\nsamplers = [\n  { use = "top_k", k = 40 },\n'
        '  { use = "top_p.v1", p = 0.95, min_keep = 2 },\n  { use = "min_p", p = 0.05 },\n'
        '  { use = "temperature", t = 0.8 },\n  { use = "dist", seed = 42 },\n]\n'
    )
    chain = Chain.load(path)
    assert [s["name"] for s in chain.describe()] == ["top_k.v1", "top_p.v1", "min_p.v1", "temperature.v1", "dist.v1"]
    assert chain.describe()[1]["params"] == {"p": 0.95, "min_keep": 2}
    assert chain.config.name == "mine" and chain.backend_name == "cpu"


def test_a_dict_without_the_chain_table_is_accepted():
    chain = Chain.load({"samplers": [{"use": "greedy"}]})
    assert [s["name"] for s in chain.describe()] == ["greedy.v1"]


def test_numbers_from_numpy_are_numbers():
    np = pytest.importorskip("numpy")
    chain = Chain.load(
        {"samplers": [{"use": "top_k", "k": np.int64(5)}, {"use": "top_p", "p": np.float32(0.5)}, {"use": "greedy"}]}
    )
    assert chain.describe()[0]["params"]["k"] == 5


@pytest.mark.parametrize("name", sorted(samplechain.load_registry().presets))
def test_every_preset_is_a_valid_chain(name):
    chain = Chain.from_preset(name)
    assert chain.describe()[-1]["stage"] == "select"


def test_unknown_preset_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"presets.lama.cpp: no such preset; did you mean 'llama.cpp'"):
        Chain.load("preset:lama.cpp")


# ---------------------------------------------------------------- pitfalls: warned, never refused
def _warnings_of(entries):
    import warnings

    from samplechain import ChainWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chain = Chain.load({"samplers": entries})
    return chain, [str(w.message) for w in caught if issubclass(w.category, ChainWarning)]


def test_penalty_or_bias_after_a_truncation_is_warned_and_still_runs():
    chain, msgs = _warnings_of(
        [
            {"use": "top_k", "k": 5},
            {"use": "penalties", "repeat": 1.3},
            {"use": "logit_bias", "bias": {"3": 2.0}},
            {"use": "greedy"},
        ]
    )
    assert len(msgs) == 2
    assert "samplers[1].use = 'penalties'" in msgs[0] and "'top_k' (samplers[0])" in msgs[0]
    assert "only touch the tokens that survived" in msgs[0] and "move it before 'top_k'" in msgs[0]
    assert "samplers[2].use = 'logit_bias'" in msgs[1] and "biases first" in msgs[1]
    assert len(chain.samplers) == 4


def test_truncation_before_mirostat_is_warned():
    _, msgs = _warnings_of(
        [{"use": "top_p", "p": 0.9}, {"use": "temperature", "t": 0.8}, {"use": "mirostat_v2", "tau": 5.0, "eta": 0.1}]
    )
    assert len(msgs) == 1 and "llama.cpp drops truncation samplers" in msgs[0] and "'top_p'" in msgs[0]


def test_reference_orders_raise_no_warning():
    for entries in (
        [{"use": "penalties"}, {"use": "dry", "breakers": []}, {"use": "top_k", "k": 40}, {"use": "dist"}],
        [{"use": "temperature", "t": 0.8}, {"use": "mirostat", "tau": 5.0, "eta": 0.1}],
        [
            {"use": "allowed_tokens", "ids": [1, 2]},
            {"use": "top_k", "k": 2},
            {"use": "allowed_tokens", "id": "again", "ids": [1]},
            {"use": "greedy"},
        ],
    ):
        assert _warnings_of(entries)[1] == []
