"""docs/config.md is the generated reference of every config section, and it is current."""

from __future__ import annotations

from pathlib import Path

from t1_actors.job.config import RunConfig
from t1_actors.job.reference import reference

DOC = Path(__file__).resolve().parent.parent / "docs" / "config.md"


def test_the_config_reference_is_current_and_names_every_section_and_key():
    text = reference()
    assert DOC.read_text() == text, "docs/config.md is stale: python -m t1_actors.job.reference > docs/config.md"
    for name in RunConfig.model_fields:
        assert f"## `[{name}]`" in text or f"## `[[{name}]]`" in text
    assert "## `[sandbox.local]`" in text and "## `[sandbox.daytona]`" in text  # nested tables, not object dumps
    assert '[[actors]] options, role = "sampler"' in text
    assert "| `rl_steps` |" in text and "| `sft_passes` |" in text and "| `batch_size` |" in text
