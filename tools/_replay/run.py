"""A run directory as the replay tools see it: its event log, its weights by version, its tokenizer.

Layout written by the campaign: ``RUN/log`` (the Zarr event log; or the URL in ``RUN/log.url`` when
``[storage] url`` put it on S3), ``RUN/weights/<version dir>`` (a policy version as config.json +
model.safetensors, named by WeightsPublished events), and the run's tokenizer (``RUN/tokenizer.json``).
``RUN`` may also be the log directory itself, or the log's URL (``s3://BUCKET/PREFIX``, credentials and
endpoint from the standard AWS variables): the run directory is then the one its published weights are
in (``RUN/weights/vNNNNN``), when this machine has it.
"""

from __future__ import annotations

import re
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from schemas import Event, SamplerTurn, WeightsPublished
from storage import EventLog, LogError
from t1_actors.layout import has_log, log_location, run_dir_of_weights, sha256_file

TOKENIZER_NAMES = ("tokenizer.json", "tokenizer/tokenizer.json", "assets/tokenizer.json")


class RunError(ValueError):
    """A run directory is missing something a command needs; the message says what and the fix."""


@dataclass
class RunView:
    """All events of a run in log order, with lookups the tools need."""

    root: Path | None  # None: a log read by URL whose run directory this machine does not have
    log_path: Path | str
    events: list[tuple[str, Event]]
    _models: OrderedDict = field(default_factory=OrderedDict, repr=False)

    @classmethod
    def open(cls, run: str | Path) -> RunView:
        by_url = "://" in str(run) and not str(run).startswith("file://")
        root: Path | None = None if by_url else Path(str(run).removeprefix("file://"))
        if root is not None and not root.exists():
            raise RunError(f"run {root} does not exist; pass a run directory (with log/), a log directory or "
                           "the log's URL (s3://BUCKET/PREFIX)")
        log_path = str(run) if root is None else log_location(root) if has_log(root) else root
        try:
            log = EventLog.open(log_path)
        except (LogError, OSError, ValueError) as exc:
            raise RunError(f"{log_path}: not a readable t1 event log ({type(exc).__name__}: {exc}); "
                           "pass the run directory the campaign wrote") from exc
        if root is not None and root == log_path and root.name == "log":
            root = root.parent
        try:
            events = list(_read_all(log))
        except (LogError, OSError, ValueError) as exc:  # CorruptionError names the segment, array and chunk
            raise RunError(f"{log_path}: cannot read the log: {exc}") from exc
        if root is None:
            root = next((found for _, e in events if isinstance(e, WeightsPublished)
                         if (found := run_dir_of_weights(e.location)) is not None), None)
        return cls(root=root, log_path=log_path, events=events)

    # ------------------------------------------------------------ lookups

    def of_kind(self, cls: type[Event]) -> list[tuple[str, Event]]:
        return [(eid, e) for eid, e in self.events if isinstance(e, cls)]

    def by_trial(self, trial_id: str) -> list[tuple[str, Event]]:
        return [(eid, e) for eid, e in self.events if getattr(e, "trial_id", None) == trial_id]

    def trial_ids(self) -> list[str]:
        seen = dict.fromkeys(e.trial_id for _, e in self.events if hasattr(e, "trial_id"))
        return list(seen)

    def sampler_turns(self) -> dict[str, list[SamplerTurn]]:
        out: dict[str, list[SamplerTurn]] = defaultdict(list)
        for _, e in self.of_kind(SamplerTurn):
            out[e.trial_id].append(e)
        return out

    def index_of(self, event_id: str) -> int:
        for i, (eid, _) in enumerate(self.events):
            if eid == event_id:
                return i
        if event_id.lstrip("-").isdigit():  # a position in log order
            i = int(event_id)
            if -len(self.events) <= i < len(self.events):
                return i % len(self.events)
        raise RunError(f"event {event_id!r} is not in {self.log_path} ({len(self.events)} events; ids look like "
                       f"{self.events[0][0]!r} - or pass a position in log order)" if self.events else
                       f"event {event_id!r}: the log {self.log_path} is empty")

    # ------------------------------------------------------------ weights and tokenizer

    def weights_dir(self, version: int) -> Path:
        """Directory of a policy version: the WeightsPublished location, else RUN/weights/<name ending in version>."""
        for _, e in self.of_kind(WeightsPublished):
            if e.version == version:
                path = Path(e.location)
                if not path.is_absolute():
                    if self.root is None:
                        continue
                    path = self.root / path
                if path.is_file():
                    path = path.parent
                if path.exists():
                    return path
        weights = None if self.root is None else self.root / "weights"
        if weights is not None and weights.is_dir():
            for child in sorted(weights.iterdir()):
                m = re.search(r"(\d+)$", child.name)
                if child.is_dir() and m and int(m.group(1)) == version:
                    return child
        raise RunError(f"no weights for policy version {version} in {self.root or self.log_path} "
                       f"(no WeightsPublished event with an existing location, no {weights}/<name ending in "
                       f"{version}>); keep the run's weights to replay it")

    def weights_checksum_ok(self, version: int) -> bool | None:
        """Does the published sha256 match the weights file? None when no event records one."""
        for _, e in self.of_kind(WeightsPublished):
            if e.version == version:
                directory = self.weights_dir(version)
                files = sorted(directory.glob("*.safetensors"))
                if not files:
                    return False
                digests = {sha256_file(f) for f in files}
                return e.sha256 in digests or sha256_file(*files) == e.sha256
        return None

    def model(self, version: int):
        """The policy of a version (fp32, eval mode), two kept in memory."""
        if version in self._models:
            self._models.move_to_end(version)
            return self._models[version]
        import torch  # noqa: PLC0415 - keeps t1-replay free of torch until a policy is loaded (1.5 s)

        from t1_actors.policy.model import MoEPolicy  # noqa: PLC0415 - policy.model imports torch; only when a policy is loaded

        model = MoEPolicy.load(self.weights_dir(version), dtype=torch.float32).eval()
        self._models[version] = model
        while len(self._models) > 2:
            self._models.popitem(last=False)
        return model

    def tokenizer(self, path: str | Path | None = None):
        """The run's tokenizer (HF tokenizers), or None when the run did not keep one. ``path``: a tokenizer.json
        or an HF tokenizer directory (what ``policy.load_tokenizer`` takes)."""
        if path is not None:
            from t1_actors.policy import load_tokenizer  # noqa: PLC0415 - t1_actors.policy imports torch (3.3 s); only for a tokenizer path

            if not Path(path).exists():
                raise RunError(f"--tokenizer {path}: no such file or directory (a tokenizer.json or an HF "
                               "tokenizer directory)")
            try:
                return load_tokenizer(path).backend_tokenizer
            except (OSError, ValueError) as exc:
                raise RunError(f"--tokenizer {path}: {exc}") from None
        for name in TOKENIZER_NAMES if self.root is not None else ():
            candidate = self.root / name
            if candidate.is_file():
                return Tokenizer.from_file(str(candidate))
        return None


def _read_all(log):
    """(event_id, event) in the log's merged order."""
    yield from log.events()


