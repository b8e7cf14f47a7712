"""llama.cpp sampling flags <-> chain: `from_llama_cpp`, `to_llama_cpp`. See docs/convert.md for the mapping table."""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import ConfigError
from .common import _TEMPS, _checked, _Entry, _exported, _hint, _off, _only, _plain, _temperature

# ---------------------------------------------------------------------------------------------- llama.cpp
# common/sampling.cpp: common_sampler_types_from_names (canonical, then the alternative names) / _from_chars
_LC_CANONICAL = {
    "dry": "dry",
    "top_k": "top_k",
    "top_p": "top_p",
    "top_n_sigma": "top_n_sigma",
    "typ_p": "typ_p",
    "min_p": "min_p",
    "temperature": "temperature",
    "xtc": "xtc",
    "infill": "infill",
    "penalties": "penalties",
    "adaptive_p": "adaptive_p",
}
_LC_ALT = {
    "top-k": "top_k",
    "top-p": "top_p",
    "top-n-sigma": "top_n_sigma",
    "nucleus": "top_p",
    "typical-p": "typ_p",
    "typical": "typ_p",
    "typ-p": "typ_p",
    "typ": "typ_p",
    "min-p": "min_p",
    "temp": "temperature",
    "adaptive-p": "adaptive_p",
}
LLAMA_CPP_SAMPLER_NAMES = {**_LC_CANONICAL, **_LC_ALT}
LLAMA_CPP_SAMPLER_CHARS = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "t": "temperature",
    "x": "xtc",
    "i": "infill",
    "e": "penalties",
    "a": "adaptive_p",
}
_LC_DEFAULT_ORDER = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
_LC_DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a fresh random seed

# flag -> (key of common_params_sampling, parser); aliases as common/arg.cpp
_F = float
_LC_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {}
for _names, _key, _kind in [
    (("--samplers",), "samplers", str),
    (("--sampling-seq", "--sampler-seq"), "sampling_seq", str),
    (("-s", "--seed"), "seed", int),
    (("--top-k",), "top_k", int),
    (("--top-p",), "top_p", _F),
    (("--min-p",), "min_p", _F),
    (("--typical", "--typical-p"), "typ_p", _F),
    (("--temp", "--temperature"), "temp", _F),
    (("--top-nsigma", "--top-n-sigma"), "top_n_sigma", _F),
    (("--xtc-probability",), "xtc_probability", _F),
    (("--xtc-threshold",), "xtc_threshold", _F),
    (("--dynatemp-range",), "dynatemp_range", _F),
    (("--dynatemp-exp",), "dynatemp_exponent", _F),
    (("--repeat-last-n",), "penalty_last_n", int),
    (("--repeat-penalty",), "penalty_repeat", _F),
    (("--presence-penalty",), "penalty_present", _F),
    (("--frequency-penalty",), "penalty_freq", _F),
    (("--dry-multiplier",), "dry_multiplier", _F),
    (("--dry-base",), "dry_base", _F),
    (("--dry-allowed-length",), "dry_allowed_length", int),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int),
    (("--dry-sequence-breaker",), "dry_sequence_breaker", str),
    (("--mirostat",), "mirostat", int),
    (("--mirostat-lr",), "mirostat_eta", _F),
    (("--mirostat-ent",), "mirostat_tau", _F),
    (("--adaptive-target",), "adaptive_target", _F),
    (("--adaptive-decay",), "adaptive_decay", _F),
    (("--ignore-eos",), "ignore_eos", bool),
    (("-l", "--logit-bias"), "logit_bias", str),
    (("--grammar",), "grammar", str),
    (("-j", "--json-schema"), "json_schema", str),
]:
    for _n in _names:
        _LC_FLAGS[_n] = (_key, _kind)

# common_params_sampling's defaults (common/common.h)
_LC_DEFAULTS: dict[str, Any] = {
    "seed": _LC_DEFAULT_SEED,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "typ_p": 1.0,
    "temp": 0.8,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "penalty_last_n": 64,
    "penalty_repeat": 1.0,
    "penalty_freq": 0.0,
    "penalty_present": 0.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": -1,
    "dry_sequence_breakers": ["\n", ":", '"', "*"],
    "top_n_sigma": -1.0,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
    "ignore_eos": False,
    "logit_bias": [],
    "grammar": "",
    "json_schema": "",
    "samplers": list(_LC_DEFAULT_ORDER),
}
_IGNORE_EOS_N = 2**31 - 1  # min_new_tokens with this n bans the eos ids for the whole generation


def _lc_number(flag: str, value: str, kind: Callable[[str], Any]) -> Any:
    try:
        if kind is int:
            return int(value, 0) if value.strip().lower().startswith(("0x", "-0x")) else int(value)
        return float(value)
    except ValueError:
        expect = "an integer" if kind is int else "a number"
        raise ConfigError(f"llama.cpp flags: {flag} {value!r}: expected {expect}") from None


def _lc_sampler_names(flag: str, value: str, chars: bool) -> list[str]:
    out = []
    if chars:
        for c in value:
            if c not in LLAMA_CPP_SAMPLER_CHARS:
                valid = "".join(LLAMA_CPP_SAMPLER_CHARS)
                raise ConfigError(
                    f"llama.cpp flags: {flag} {value!r}: unknown sampler letter {c!r} (valid: {valid}: "
                    + ", ".join(f"{k}={v}" for k, v in LLAMA_CPP_SAMPLER_CHARS.items())
                    + ")"
                )
            out.append(LLAMA_CPP_SAMPLER_CHARS[c])
        return out
    for name in value.split(";"):
        if name == "":
            continue  # string_split keeps empty pieces; llama.cpp warns and skips them
        if name not in LLAMA_CPP_SAMPLER_NAMES:
            raise ConfigError(
                f"llama.cpp flags: {flag} {value!r}: unknown sampler name {name!r}"
                f"{_hint(name, list(LLAMA_CPP_SAMPLER_NAMES))} (valid: {', '.join(_LC_CANONICAL)})"
            )
        out.append(LLAMA_CPP_SAMPLER_NAMES[name])
    return out


def _lc_logit_bias(flag: str, value: str) -> tuple[int, float]:
    m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S.*)", value)
    try:
        if m is None:
            raise ValueError
        bias = float(m[3])
    except ValueError:
        raise ConfigError(
            f"llama.cpp flags: {flag} {value!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf"
        ) from None
    return int(m[1]), -bias if m[2] == "-" else bias


def _lc_parse(args: Sequence[str] | str) -> dict[str, Any]:
    if isinstance(args, str):
        try:
            tokens = shlex.split(args)
        except ValueError as exc:  # an unclosed quote
            raise ConfigError(f"llama.cpp flags: {args!r}: {exc}") from None
    elif isinstance(args, (list, tuple)) and all(isinstance(a, str) for a in args):
        tokens = list(args)
    else:
        raise ConfigError(
            f'llama.cpp flags = {args!r}: expected the flags as one string ("--top-k 20 --temp 0.7") or a list of '
            'strings (["--top-k", "20"])'
        )
    s = copy.deepcopy(_LC_DEFAULTS)
    breakers: list[str] | None = None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        flag, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        if flag not in _LC_FLAGS:
            raise ConfigError(
                f"llama.cpp flags: unknown sampling flag {tok!r}{_hint(flag, list(_LC_FLAGS))} "
                f"(supported: {', '.join(n for n in _LC_FLAGS if n.startswith('--'))})"
            )
        key, kind = _LC_FLAGS[flag]
        if kind is bool:
            if eq:
                raise ConfigError(f"llama.cpp flags: {flag} takes no value (got {tok!r})")
            s[key] = True
            i += 1
            continue
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise ConfigError(f"llama.cpp flags: {flag} needs a value")
            value = tokens[i + 1]
            i += 2
        if key == "samplers":
            s["samplers"] = _lc_sampler_names(flag, value, chars=False)
        elif key == "sampling_seq":
            s["samplers"] = _lc_sampler_names(flag, value, chars=True)
        elif key == "dry_sequence_breaker":
            breakers = [] if breakers is None else breakers  # the first one clears the defaults
            if value == "none":
                breakers = []
            else:
                breakers.append(value)
        elif key == "logit_bias":
            s["logit_bias"].append(_lc_logit_bias(flag, value))
        elif key in ("grammar", "json_schema"):
            s["grammar"], s["json_schema"] = ("", "")
            s[key] = value
        elif kind is str:
            s[key] = value
        else:
            number = _lc_number(flag, value, kind)
            if key == "seed":
                number = number & 0xFFFFFFFF  # std::stoul into a uint32_t: -1 is LLAMA_DEFAULT_SEED
            elif key == "temp":
                number = max(number, 0.0)
            elif key == "dry_base" and number < 1.0:
                continue  # llama.cpp ignores a base below 1
            elif key in ("penalty_last_n", "dry_penalty_last_n") and number < -1:
                raise ConfigError(f"llama.cpp flags: {flag} {value}: must be >= -1 (-1 = context size, 0 disables)")
            elif key == "mirostat" and number not in (0, 1, 2):
                raise ConfigError(f"llama.cpp flags: {flag} {value}: must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0)")
            s[key] = number
    if breakers is not None:
        s["dry_sequence_breakers"] = breakers
    return s


def from_llama_cpp(args: Sequence[str] | str) -> dict[str, Any]:
    """The chain llama.cpp's `common_sampler_init` builds for these command-line sampling flags."""
    s = _lc_parse(args)
    seed = None if s["seed"] == _LC_DEFAULT_SEED else int(s["seed"])
    seeded = {} if seed is None else {"seed": seed}
    front: list[dict[str, Any]] = []
    if s["grammar"]:
        front.append({"use": "grammar", "gbnf": s["grammar"]})
    elif s["json_schema"]:
        front.append({"use": "grammar", "json_schema": s["json_schema"]})
    if s["ignore_eos"]:  # llama.cpp: a -inf logit bias on every end-of-generation token
        front.append({"use": "min_new_tokens", "id": "ignore_eos", "n": _IGNORE_EOS_N})
    if s["logit_bias"]:
        front.append({"use": "logit_bias", "bias": [[t, b] for t, b in s["logit_bias"]]})
    temp = {"use": "temp_ext", "t": s["temp"], "delta": s["dynatemp_range"], "exponent": s["dynatemp_exponent"]}
    if s["mirostat"] == 1:
        samplers = front + [
            {**temp, "delta": 0.0, "exponent": 1.0},
            {"use": "mirostat", "tau": s["mirostat_tau"], "eta": s["mirostat_eta"], "m": 100, **seeded},
        ]
        return _checked({"name": "llama.cpp-mirostat", "samplers": samplers}, "llama.cpp flags")
    if s["mirostat"] == 2:
        samplers = front + [
            {**temp, "delta": 0.0, "exponent": 1.0},
            {"use": "mirostat_v2", "tau": s["mirostat_tau"], "eta": s["mirostat_eta"], **seeded},
        ]
        return _checked({"name": "llama.cpp-mirostat-v2", "samplers": samplers}, "llama.cpp flags")
    by_name = {
        "penalties": {
            "use": "penalties",
            "repeat": s["penalty_repeat"],
            "frequency": s["penalty_freq"],
            "presence": s["penalty_present"],
            "last_n": s["penalty_last_n"],
            "scope": "llama.cpp",
        },
        "dry": {
            "use": "dry",
            "multiplier": s["dry_multiplier"],
            "base": s["dry_base"],
            "allowed_length": s["dry_allowed_length"],
            "penalty_last_n": s["dry_penalty_last_n"],
            "breakers": list(s["dry_sequence_breakers"]),
        },
        "top_n_sigma": {"use": "top_n_sigma", "n": s["top_n_sigma"]},
        "top_k": {"use": "top_k", "k": s["top_k"]},
        "typ_p": {"use": "typical", "p": s["typ_p"]},
        "top_p": {"use": "top_p", "p": s["top_p"]},
        "min_p": {"use": "min_p", "p": s["min_p"]},
        "xtc": {"use": "xtc", "probability": s["xtc_probability"], "threshold": s["xtc_threshold"], **seeded},
        "temperature": temp,
        "infill": {"use": "infill"},
    }
    samplers = list(front)
    used: dict[str, int] = {}
    adaptive = False
    for name in s["samplers"]:
        if name == "adaptive_p":
            adaptive = True  # llama.cpp moves it to the end, in place of dist
            continue
        entry = dict(by_name[name])
        used[entry["use"]] = used.get(entry["use"], 0) + 1
        if used[entry["use"]] > 1:  # the same sampler twice: distinct ids so both can be addressed
            entry["id"] = f"{entry['use']}_{used[entry['use']]}"
        samplers.append(entry)
    if adaptive:
        samplers.append({"use": "adaptive_p", "target": s["adaptive_target"], "decay": s["adaptive_decay"], **seeded})
    else:
        samplers.append({"use": "dist", **seeded})
    return _checked({"name": "llama.cpp", "samplers": samplers}, "llama.cpp flags")


def _fmt(x: float) -> str:
    return repr(float(x)) if not float(x).is_integer() else str(int(x)) if abs(x) < 1e15 else repr(float(x))


_LC_TARGET = "llama.cpp"
# the flag that sets each common_params_sampling key, and the order the flags are written in (--seed last)
_LC_FLAG_OF = {
    **{key: f for f, (key, _k) in _LC_FLAGS.items() if f.startswith("--") and key not in ("samplers",)},
    "typ_p": "--typical",
    "temp": "--temp",
    "seed": "--seed",
    "top_n_sigma": "--top-n-sigma",
    "json_schema": "--json-schema",
}
_LC_FLAG_ORDER = [k for k in _LC_DEFAULTS if k != "seed"] + ["seed"]


class _LcSettings:
    """What a chain sets of llama.cpp's sampling: common_params_sampling keys, the --samplers names in order, the
    seeds its entries ask for (llama.cpp has one --seed) and the --logit-bias flags."""

    def __init__(self) -> None:
        self.s: dict[str, Any] = {}
        self.names: list[str] = []
        self.seeds: list[tuple[_Entry, int]] = []
        self.bias_flags: list[str] = []

    def put(self, e: _Entry, key: str, value: Any) -> None:
        if key in self.s and self.s[key] != value:
            raise ConfigError(
                f"{e.label()}: llama.cpp has one {key} for every sampler; another entry set "
                f"{self.s[key]!r}, this one {value!r}"
            )
        self.s[key] = value

    def seed_of(self, e: _Entry) -> None:
        if e.p.get("seed") is not None:
            self.seeds.append((e, int(e.p["seed"])))

    def saved(self) -> tuple[dict[str, Any], list[str], list[tuple[_Entry, int]]]:
        return dict(self.s), list(self.names), list(self.seeds)

    def restore(self, saved: tuple[dict[str, Any], list[str], list[tuple[_Entry, int]]]) -> None:
        self.s.clear()
        self.s.update(saved[0])
        self.names[:] = saved[1]
        self.seeds[:] = saved[2]


# ------------------------------------------------------------------- the samplers of the --samplers chain
_LcSampler = Callable[[_Entry, _LcSettings], None]


def _lc_single(param: str, key: str, name: str, **fixed: Any) -> _LcSampler:
    """A sampler with one parameter `param`, set by the flag of `key` (the others at their defaults or `fixed`)."""

    def add(e: _Entry, out: _LcSettings) -> None:
        _only(e, _LC_TARGET, (param,), **fixed)
        out.put(e, key, e.p[param])
        out.names.append(name)

    return add


def _lc_penalties(e: _Entry, out: _LcSettings) -> None:
    _only(e, _LC_TARGET, ("repeat", "frequency", "presence", "last_n"), scope="llama.cpp")
    for k, key in (
        ("repeat", "penalty_repeat"),
        ("frequency", "penalty_freq"),
        ("presence", "penalty_present"),
        ("last_n", "penalty_last_n"),
    ):
        out.put(e, key, e.p[k])
    out.names.append("penalties")


def _lc_dry(e: _Entry, out: _LcSettings) -> None:
    _only(e, _LC_TARGET, ("multiplier", "base", "allowed_length", "penalty_last_n", "breakers"))
    if e.p["base"] < 1:
        raise ConfigError(f"{e.label()}: base = {e.p['base']!r}: llama.cpp ignores a --dry-base below 1")
    for k, key in (
        ("multiplier", "dry_multiplier"),
        ("base", "dry_base"),
        ("allowed_length", "dry_allowed_length"),
        ("penalty_last_n", "dry_penalty_last_n"),
        ("breakers", "dry_sequence_breakers"),
    ):
        out.put(e, key, _plain(e.p[k]))
    out.names.append("dry")


def _lc_xtc(e: _Entry, out: _LcSettings) -> None:
    _only(e, _LC_TARGET, ("probability", "threshold", "seed"))
    out.put(e, "xtc_probability", e.p["probability"])
    out.put(e, "xtc_threshold", e.p["threshold"])
    out.seed_of(e)
    out.names.append("xtc")


def _lc_temperature(e: _Entry, out: _LcSettings) -> None:
    p = e.p
    if e.name == "temp_ext":
        _only(e, _LC_TARGET, ("t", "delta", "exponent"), formula="llama.cpp")
        if p["t"] < 0:
            raise ConfigError(f"{e.label()}: t = {p['t']!r}: llama.cpp clamps --temp to >= 0")
        out.put(e, "temp", p["t"])
        out.put(e, "dynatemp_range", p["delta"])
        out.put(e, "dynatemp_exponent", p["exponent"])
    else:
        out.put(e, "temp", p["t"])
        out.put(e, "dynatemp_range", 0.0)
    out.names.append("temperature")


def _lc_infill(e: _Entry, out: _LcSettings) -> None:
    _only(e, _LC_TARGET, ("enabled",))
    out.names.append("infill")


_LC_SAMPLERS: dict[str, _LcSampler] = {
    "penalties": _lc_penalties,
    "dry": _lc_dry,
    "top_n_sigma": _lc_single("n", "top_n_sigma", "top_n_sigma"),
    "top_k": _lc_single("k", "top_k", "top_k"),
    "typical": _lc_single("p", "typ_p", "typ_p", semantics="llama.cpp"),
    "top_p": _lc_single("p", "top_p", "top_p"),
    "min_p": _lc_single("p", "min_p", "min_p"),
    "xtc": _lc_xtc,
    "temperature": _lc_temperature,
    "temp_ext": _lc_temperature,
    "infill": _lc_infill,
}


def _lc_before_mirostat(e: _Entry, out: _LcSettings) -> None:
    """With mirostat llama.cpp runs one temperature and nothing else: other entries must do nothing."""
    if e.name in _TEMPS and "temp" not in out.s:
        out.put(e, "temp", _temperature(e, _LC_TARGET))
        return
    if _off(e):
        return
    raise ConfigError(
        f"{e.label()}: with mirostat llama.cpp runs only temperature before it (it drops "
        f"every other sampler), so {e.name} cannot be expressed"
    )


def _lc_sampler(e: _Entry, out: _LcSettings, mirostat: bool) -> None:
    if mirostat:
        _lc_before_mirostat(e, out)
        return
    add = _LC_SAMPLERS.get(e.name)
    if add is None:
        raise ConfigError(
            f"{e.label()}: llama.cpp has no {e.name} sampler (its samplers: "
            f"{', '.join(_LC_CANONICAL)}; plus grammar, --logit-bias and --ignore-eos first)"
        )
    add(e, out)


# --------------------------------------------------------------------------------------------- export
def _is_front(e: _Entry) -> bool:
    """grammar, --ignore-eos (min_new_tokens over the whole generation) and --logit-bias: llama.cpp applies them
    before the --samplers chain."""
    is_ignore_eos = e.name == "min_new_tokens" and e.p["n"] >= _IGNORE_EOS_N and not e.p["eos_ids"]
    return e.name in ("grammar", "logit_bias") or is_ignore_eos


def _lc_front(e: _Entry, out: _LcSettings) -> None:
    p = e.p
    if e.name == "grammar":
        _only(e, _LC_TARGET, ("gbnf", "json_schema", "eos_ids", "json_whitespace"))
        if p["gbnf"]:
            out.put(e, "grammar", p["gbnf"])
        elif p["json_schema"]:
            out.put(e, "json_schema", p["json_schema"])
    elif e.name == "logit_bias":
        from_pairs = p["bias"].items() if isinstance(p["bias"], Mapping) else p["bias"]
        for tok, b in from_pairs:
            out.bias_flags += ["--logit-bias", f"{int(tok)}{'-' if float(b) < 0 else '+'}{_fmt(abs(float(b)))}"]
    else:
        out.put(e, "ignore_eos", True)


def _lc_body(body: list[_Entry], out: _LcSettings, mirostat: bool) -> None:
    """The entries before the selector: the front first, then the --samplers chain (or mirostat's temperature)."""
    front_done = False
    for e in body:
        if _is_front(e):
            if _off(e):
                continue
            if front_done:
                raise ConfigError(
                    f"{e.label()} runs after a sampler of the --samplers chain, which llama.cpp cannot "
                    f"express: it applies the grammar, --ignore-eos and --logit-bias first"
                )
            _lc_front(e, out)
            continue
        front_done = front_done or not _off(e)  # a no-op entry commutes with the front
        saved = out.saved()
        try:
            _lc_sampler(e, out, mirostat)
        except ConfigError:
            if not _off(e):
                raise
            out.restore(saved)  # a no-op entry llama.cpp cannot name (vLLM's allowed_tokens = [] ...): left out


def _lc_selector(selector: _Entry, out: _LcSettings, mirostat: bool) -> None:
    """dist (the default), adaptive_p (last of --samplers) or --mirostat 1 / 2 with its settings."""
    if selector.name == "dist":
        out.seed_of(selector)
    elif selector.name == "adaptive_p":
        out.put(selector, "adaptive_target", selector.p["target"])
        out.put(selector, "adaptive_decay", selector.p["decay"])
        out.seed_of(selector)
        out.names.append("adaptive_p")
    elif mirostat:
        out.put(selector, "mirostat", 1 if selector.name == "mirostat" else 2)
        _only(selector, _LC_TARGET, ("tau", "eta", "seed"), m=100)
        out.put(selector, "mirostat_tau", selector.p["tau"])
        out.put(selector, "mirostat_eta", selector.p["eta"])
        out.seed_of(selector)
    else:
        raise ConfigError(
            f"{selector.label()}: llama.cpp always ends its chain with dist (or mirostat / "
            f"adaptive_p); for {selector.name} put temp_ext with t = 0 before dist"
        )


def _lc_seed(out: _LcSettings) -> None:
    """The one --seed: every seeded entry must ask for the same one, in llama.cpp's range."""
    seeds = out.seeds
    for e, seed in seeds:
        if seed != seeds[0][1]:
            raise ConfigError(
                f"{e.label()}: seed = {seed} differs from {seeds[0][0].label()}'s {seeds[0][1]}: "
                "llama.cpp has one --seed"
            )
        if not 0 <= seed < _LC_DEFAULT_SEED:
            raise ConfigError(f"{e.label()}: seed = {seed}: llama.cpp seeds are in [0, 2**32 - 1)")
    if seeds:
        out.s["seed"] = seeds[0][1]


def _lc_flags(out: _LcSettings, mirostat: bool) -> list[str]:
    """--samplers where the order is not the default, the --logit-bias flags, then one flag per key away from its
    default, in common_params_sampling's order."""
    flags = list(out.bias_flags)
    if not mirostat and out.names != _LC_DEFAULT_ORDER:
        flags = ["--samplers", ";".join(out.names)] + flags
    for key, value in sorted(out.s.items(), key=lambda kv: _LC_FLAG_ORDER.index(kv[0])):
        if key == "dry_sequence_breakers":
            if list(value) != _LC_DEFAULTS[key]:
                for b in value or ["none"]:
                    flags += ["--dry-sequence-breaker", b]
            continue
        if key == "ignore_eos":
            flags.append("--ignore-eos")
            continue
        if value == _LC_DEFAULTS.get(key):
            continue
        flags += [_LC_FLAG_OF[key], value if isinstance(value, str) else _fmt(value)]
    return flags


def to_llama_cpp(chain: Any) -> list[str]:
    """llama.cpp command-line flags that build this chain (`--samplers` gives the order); ConfigError where not."""
    samplers, stop = _exported(chain, "llama.cpp")
    for e in stop:
        raise ConfigError(
            f"{e.label()}: llama.cpp's sampling flags carry no stopping criteria (use -n / "
            f"--reverse-prompt on the llama.cpp command line)"
        )
    selector = samplers[-1]
    mirostat = selector.name in ("mirostat", "mirostat_v2")
    out = _LcSettings()
    _lc_body(samplers[:-1], out, mirostat)
    _lc_selector(selector, out, mirostat)
    _lc_seed(out)
    return _lc_flags(out, mirostat)
