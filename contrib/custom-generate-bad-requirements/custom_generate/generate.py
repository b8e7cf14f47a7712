"""Never imported: the requirements check fails first."""

raise RuntimeError("custom-generate-bad-requirements: this module must never be imported")


def generate(model, *args, **kwargs):  # pragma: no cover
    raise RuntimeError("unreachable")
