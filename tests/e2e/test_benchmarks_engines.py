"""The SmolLM2 engines benchmark still runs: its --quick run, as a user starts it; its
figures' names and types and its checks (OpenBLAS's greedy tokens equal MKL's) are
asserted, never its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from carpool.backends.smollm2.served import default_engine
from e2e.conftest import scenario, shape

# A quick run's bound: three engines load (seconds each) and step 1 and 16 sequences; two
# more serve 16 chats for ~50 ticks each.
RUN_WITHIN_S = 300

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_WITHIN_S + 30)]


def run_of(test: pytest.Function, folder: Path) -> tuple[list[str], float]:
    """``python -m benchmarks.streams.engines --quick``."""
    return scenario("benchmarks.streams.engines", folder), RUN_WITHIN_S


def test_engines_quick_run(figures: dict[str, object]) -> None:
    engines = ["fp32_openblas", "fp32_mkl", "llama"]
    int8 = default_engine() == "torch"  # int8's kernels run fast here
    if int8:
        engines.append("int8")
    steps = {
        f"{engine}_{stat}_{count}": "float"
        for engine in engines
        for stat in ("ms_per_step", "tokens_per_s")
        for count in (1, 16)
    }
    assert shape(figures) == {
        **steps,
        **{f"fp32_openblas_over_mkl_{count}": "float" for count in (1, 16)},
        **{f"fp32_openblas_tokens_equal_mkl_{count}": "bool" for count in (1, 16)},
        **{f"int8_over_fp32_{count}": "float" for count in (1, 16) if int8},
        **{f"first_token_ms_{kind}": "float" for kind in ("no_reuse", "reuse")},
        "first_token_reuse_over_no_reuse": "float",
        "first_token_reused_tokens": "float",
        **{f"int8_churn_tokens_per_s_{kind}": "float" for kind in ("fused", "apart") if int8},
        **(
            {"int8_churn_fused_over_apart": "float", "int8_churn_texts_equal": "bool"}
            if int8
            else {}
        ),
    }
    if int8:  # a decode row's tokens are its own whether a prompt rides in its pass or not
        assert figures["int8_churn_texts_equal"] is True
    assert figures["fp32_openblas_tokens_equal_mkl_1"] is True
    assert figures["fp32_openblas_tokens_equal_mkl_16"] is True
    assert all(figures[name] > 0 for name in steps)  # type: ignore[operator]
    # int8 keeps 8-token parts: every chat reuses the template's 24-token opening
    assert figures["first_token_reused_tokens"] == (24.0 if int8 else 0.0)
