"""layout decides where a run's log is: ``[storage] url`` when set, else the URL the job recorded in
RUN/log.url, else RUN/log; ``[storage] url`` must name a bucket and a prefix; a version's run directory is
found from its published location."""

from __future__ import annotations

import pytest

from storage import StorageConfig
from t1_actors.layout import has_log, log_location, log_path, record_log_location, run_dir_of_weights, weights_dir


def test_the_log_is_the_url_then_the_recorded_url_then_the_run_directory(tmp_path, actor_config):
    assert log_location(tmp_path) == log_path(tmp_path) == tmp_path / "log" and not has_log(tmp_path)
    record_log_location(tmp_path, "s3://bucket/runs/a/log")
    assert log_location(tmp_path) == "s3://bucket/runs/a/log" and has_log(tmp_path)
    assert log_location(tmp_path, "s3://bucket/runs/b/log") == "s3://bucket/runs/b/log"
    config = actor_config(storage={"url": "s3://bucket/runs/c/log/"})
    assert config.log_location() == "s3://bucket/runs/c/log"  # the config's url wins, its trailing / dropped
    assert actor_config().log_location() == log_path(config.run.dir)


@pytest.mark.parametrize("url", ["bucket/prefix", "s3://bucket", "s3://bucket/", "gs://bucket/prefix", "s3:///x"])
def test_a_storage_url_names_a_bucket_and_a_prefix(url):
    with pytest.raises(ValueError, match="s3://BUCKET/PREFIX"):
        StorageConfig(url=url)


def test_a_published_location_names_its_run_directory(tmp_path):
    version = weights_dir(tmp_path, 3)
    version.mkdir(parents=True)
    assert run_dir_of_weights(version) == tmp_path
    assert run_dir_of_weights(version / "model.safetensors") == tmp_path
    assert run_dir_of_weights(tmp_path / "elsewhere" / "v00003") is None
    assert run_dir_of_weights("/no/such/run/weights/v00003") is None
