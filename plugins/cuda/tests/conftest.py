"""Without a CUDA device, the cuda plugin's Triton kernels (samplechain_cuda_kernels) are tested on CPU tensors under
triton's interpreter. TRITON_INTERPRET=1 must be in the environment before triton is first imported (its standard
library, tl.max / tl.sum ..., is decorated then) and while the kernels run, so it is set here, for the session,
before any test module of this directory is imported. Left alone where a CUDA device is present (the `gpu` tests run
the compiled kernels), where triton was already imported, and where the caller set TRITON_INTERPRET itself."""

from __future__ import annotations

import inspect
import os
import sys

import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _backport_interpreter_loop_bounds() -> None:
    """Older interpreters (triton 3.6, the lowest supported, in .venv-tf-min) hold scalar arguments as 1-element
    arrays and make loop bounds of them with int(array), which numpy >= 2.4 refuses for arrays that are not 0-d: any
    `for i in range(0, n, BLOCK)` over an argument n fails. Later triton squeezes the array first; the same, here."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._patch_lang_tensor
    if "squeeze" in inspect.getsource(original):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patched


_backport_interpreter_loop_bounds()
