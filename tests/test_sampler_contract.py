"""The sampler contract's optional capabilities are declared: a sampler implements `sparse_changes` / `fused`
exactly when it sets `has_sparse_changes` / `has_fused_part`, and `rank_counts` only as a rank-only filter (the
executor calls each only where it is declared, so an undeclared one would silently never run)."""

import pytest

from samplechain import Sampler, get_host

DECLARED = {"sparse_changes": "has_sparse_changes", "fused": "has_fused_part"}


def _samplers() -> list[type[Sampler]]:
    host = get_host()
    host.load_all()
    registered = host.registered("sampler")
    return [cls for versions in registered.values() for cls in versions.values()]


def test_plugins_register_samplers():
    assert len(_samplers()) > 20


@pytest.mark.parametrize("method", sorted(DECLARED))
def test_a_capability_is_implemented_exactly_where_it_is_declared(method):
    flag = DECLARED[method]
    for cls in _samplers():
        implements = getattr(cls, method) is not getattr(Sampler, method)
        assert implements == getattr(cls, flag), (
            f"{cls.qualified_name()}: {'implements' if implements else 'does not implement'} {method}() but sets "
            f"{flag} = {getattr(cls, flag)}; set {flag} = {implements} on the class"
        )


def test_rank_counts_belongs_to_rank_only_filters():
    for cls in _samplers():
        if cls.rank_counts is not Sampler.rank_counts:
            assert cls.__new__(cls).is_rank_only(), (
                f"{cls.qualified_name()} implements rank_counts() but is_rank_only() is False: the executor only asks "
                "rank-only filters; return True from is_rank_only()"
            )


def test_a_plain_sampler_needs_no_capability():
    class Plain(Sampler):
        name = "plain"

    plain = Plain(None)
    assert not Plain.has_sparse_changes and not Plain.has_fused_part
    assert plain.fused(None) is None and plain.sparse_changes(None, None) is None  # type: ignore[arg-type]
    assert not plain.is_rank_only() and plain.rank_counts(None, None) is None  # type: ignore[arg-type]
