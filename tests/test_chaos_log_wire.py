"""`t1-actor chaos`'s log and wire sections (issue 23 parts 2, 3): the writer killed at injected points
under a tailing reader, a full disk, flipped bytes; forged frames and hostile peers against a live actor.
Each check also shows it can fail (a positive control, or a doctored input it must catch)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from storage import DiskFull, EventLog
from tools.chaos import main as chaos_main
from tools.chaos._events import EVENT_KINDS, ROUTING, event_for
from tools.chaos._log_bitflips import bit_flips
from tools.chaos._log_crashes import STAGES, _Tail, crash_sweep
from tools.chaos._log_disk import full_disk
from tools.chaos._log_layouts import LAYOUTS


def test_every_event_kind_is_generated_deterministically_and_reads_back_bit_exact(tmp_path):
    assert len(EVENT_KINDS) >= 10
    assert {event_for(seq).kind for seq in range(len(EVENT_KINDS))} == set(EVENT_KINDS)
    assert event_for(0) != event_for(len(EVENT_KINDS))  # same kind, other content
    for layout, config in LAYOUTS.items():
        log = EventLog.open(tmp_path / layout, create=True, config=config)
        with log.writer("w", **ROUTING) as writer:
            for seq in range(2 * len(EVENT_KINDS)):
                writer.append(event_for(seq))
        assert [e for _, e in log.events()] == [event_for(seq) for seq in range(2 * len(EVENT_KINDS))]


def test_the_tail_check_catches_a_wrong_a_skipped_and_a_repeated_event(tmp_path):
    """The audit can fail: a segment holding another seq's event, a gap and a repeat are each reported."""
    log = EventLog.open(tmp_path / "log", create=True, config=LAYOUTS["packed"])
    with log.writer("w", **ROUTING) as writer:
        for seq in (0, 1, 3, 3, 5, 6):  # at seqs 0-5: event 2 skipped, 3 twice, then each one seq late
            writer.append(event_for(seq))
    tail = _Tail(str(tmp_path / "log"), LAYOUTS["packed"])
    tail.poll()
    assert tail.reads_checked == 6
    assert [t.split(":")[1] for t in tail.torn] == ["2", "4", "5"]  # w:3 holds event 3 again: right there
    clean = EventLog.open(tmp_path / "clean", create=True, config=LAYOUTS["packed"])
    with clean.writer("w", **ROUTING) as writer:
        for seq in range(6):
            writer.append(event_for(seq))
    tail = _Tail(str(tmp_path / "clean"), LAYOUTS["packed"])
    tail.poll()
    assert tail.torn == [] and tail.reads_checked == 6


@pytest.mark.slow
def test_writer_killed_at_injected_points_never_shows_a_torn_or_lost_event(tmp_path):
    report = crash_sweep(tmp_path, seed=3, points=2 * len(STAGES))
    assert report["writer_crash_points"] == 2 * len(STAGES) and report["writer_bad_exits"] == []
    hit = set(report["crash_points_by_stage"])
    assert {s for s in STAGES if "rows" in s or "commit record" in s or "chunk files" in s} <= hit
    assert report["reads_checked"] > 100
    assert report["torn_reads"] == 0 and report["acked_lost"] == 0, report["torn_examples"]
    for layout in LAYOUTS:
        assert report["recovered"][layout]["resumed"] and report["recovered"][layout]["equal"]
        assert report["recovered"][layout]["uncommitted_seen"] == 0
    # positive control: a reader that ignores commit records sees what was never committed
    assert report["naive_reader"]["saw_uncommitted_or_torn"] > 0


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        return False
    subprocess.run(["umount", str(where)], capture_output=True)
    return True


def test_a_full_disk_is_a_named_disk_full_and_loses_nothing_committed(tmp_path):
    """Without DiskFull the writer raised a bare OSError(ENOSPC) that named neither the log nor what to do."""
    mount = tmp_path / "small"
    if not _can_mount_tmpfs(mount):
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        log = EventLog.open(mount / "log", create=True, config=LAYOUTS["packed"])
        writer = log.writer("w", **ROUTING)
        committed = 0
        with pytest.raises(DiskFull, match=r"event log full: segment 'w', during (append|commit): No space left"
                                           r".* commits before are intact; this writer stops") as info:
            while True:
                writer.append(event_for(writer.next_seq))
                writer.commit()
                committed = writer.next_seq
        assert info.value.errno == 28 and info.value.segment == "w"
        with pytest.raises(Exception, match="failed earlier"):
            writer.append(event_for(0))
        writer.abandon()
        assert [e for _, e in EventLog.open(mount / "log", config=LAYOUTS["packed"]).events()][:committed] == \
            [event_for(i) for i in range(committed)]
        assert committed > 0
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)


def test_full_disk_rounds_on_both_layouts(tmp_path):
    if not _can_mount_tmpfs(tmp_path / "probe"):
        pytest.skip("mounting a tmpfs needs root")
    report = full_disk(tmp_path, seed=2, rounds=2)
    assert report["enospc_errors"] == {"DiskFull": 2}
    assert report["enospc_committed_checked"] > 0 and report["enospc_lost_committed"] == 0
    for outcome in report["enospc_outcomes"]:
        assert outcome["later_append_refused"] and outcome["read_back_intact"] and outcome["resumed_after_space_freed"]


def test_flipped_bits_are_named_and_unnoticed_with_checksums_off(tmp_path):
    report = bit_flips(tmp_path, seed=5, flips=120, controls=5)
    assert report["bitflips_tried"] == 120
    assert report["bitflips_misnamed"] == 0 and report["bitflips_undetected_data_changed"] == 0
    assert report["bitflips_undetected_by_layout"]["packed"] == 0  # the default layout: every flip named
    assert report["checksums_off"] == {"tried": 5, "unnoticed": 5}  # positive control


@pytest.mark.slow
def test_wire_section_through_the_command(capsys, tmp_path):
    """`t1-actor chaos --only wire`: 10k forged frames and the hostile peers against a live actor under its
    supervisor; none accepted, the good peer always answered, both positive controls succeed. The run dir is
    pytest's deep tmp_path: the runtime moves sockets that would pass 107 bytes to a short dir of their own."""
    run_dir = tmp_path / "run"
    rc = chaos_main(["--only", "wire", "--run-dir", str(run_dir), "--json", "--seed", "4"])
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((run_dir / "chaos.json").read_text())
    assert report["frames_fuzzed"] == 10_000 and report["frames_not_rejected"] == 0
    assert report["frames_accepted_forged"] == 0 and report["forged_handled_by_actor"] == 0
    assert report["heartbeats_missed"] == 0 and report["pings_checked"] > 20 and not report["actor_crashed"]
    assert report["supervisor_unreachable_or_restarted"] == 0 and report["supervisor_heartbeats_seen"] > 10
    peers = report["hostile_peers"]
    assert peers["oversized_length_prefix"] == "connection closed by the actor"
    assert peers["stall_mid_bulk"] == "good peer's push delivered during the stall"
    assert peers["clock_skew_beyond_window"].startswith("2 of 2 dropped (2 counted stale)")
    assert peers["other_run_process"].startswith("10 of 10 calls unanswered") and "20 frames rejected" in peers[
        "other_run_process"]
    assert report["positive_controls"] == {"tried": 2, "succeeded": 2}
    assert all(report["positive_controls_each"].values())
    assert {e["key"] for e in report["not_tested"]} >= {"campaign", "writer_crash_points", "torn_reads"}  # not run
    assert report["wire_clean"] and rc == 0


def test_only_names_known_sections(tmp_path, capsys):
    with pytest.raises(SystemExit):
        chaos_main(["--only", "log,nope", "--run-dir", str(tmp_path)])
    assert "--only takes a comma-separated list of campaign, sandbox, tamper, log, wire" in capsys.readouterr().err
