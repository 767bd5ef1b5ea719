"""Run config validation: clear errors before any process starts."""

from __future__ import annotations

import textwrap

import pytest
from pydantic import BaseModel, ConfigDict

from t1_actors import cli
from t1_actors.job.config import load_config, parse_config
from t1_actors.job.roles import ROLES
from t1_actors.policy.config import ModelConfig
from t1_actors.runtime.config import ConfigError, RuntimeConfig
from t1_actors.runtime.config import parse_config as parse_runtime
from t1_actors.runtime.roles import actor_class
from t1_actors.train.ppo import PPOConfig

KEY = "k" * 32


def cfg(**over):
    data = {"run": {"id": "t", "dir": "/tmp/t1-cfg-test", "hmac_key": KEY},
            "actors": [{"name": "s0", "role": "sampler"}, {"name": "l0", "role": "learner"}]}
    data.update(over)
    return data


def test_defaults_and_derived_addresses():
    config = parse_config(cfg())
    s0 = config.actor("s0")
    assert config.control_address(s0) == "ipc:///tmp/t1-cfg-test/sock/s0"
    assert config.bulk_address(s0) == "ipc:///tmp/t1-cfg-test/sock/s0.bulk"
    assert config.supervisor_address.endswith("/sock/supervisor")
    assert [s.name for s in config.actors_of("sampler")] == ["s0"]
    assert config.hmac_key() == KEY.encode()
    assert config.section(ModelConfig).num_experts == 8  # registered lazily, defaults when absent


def test_a_deep_run_dir_puts_its_sockets_in_a_short_dir_of_its_own(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    config, again = (parse_config(cfg(run={"id": "t", "dir": str(deep)})) for _ in range(2))
    other = parse_config(cfg(run={"id": "t", "dir": str(deep / "other")}))
    address = config.bulk_address(config.actor("s0"))
    assert address.startswith("ipc:///tmp/t1-sock-") and len(address) - len("ipc://") <= 107
    assert address == again.bulk_address(again.actor("s0"))  # every process of the run derives the same path
    assert config.socket_dir != other.socket_dir  # and another run its own


def test_an_explicit_ipc_address_past_107_bytes_is_refused():
    with pytest.raises(ConfigError, match="longer than the 107 bytes"):
        parse_config(cfg(actors=[{"name": "a", "role": "sampler", "address": "ipc:///" + "x" * 120}]))


def test_tcp_bulk_address_is_port_plus_one():
    config = parse_config(cfg(actors=[{"name": "a", "role": "sampler", "address": "tcp://10.0.0.1:7000"}]))
    assert config.bulk_address(config.actor("a")) == "tcp://10.0.0.1:7001"


@pytest.mark.parametrize("data, needle", [
    (cfg(run={"id": "t", "dir": "/tmp/x", "colour": "red"}), "run.colour: unknown key"),
    (cfg(transport={"control_deadline_s": "soon"}), "transport.control_deadline_s"),
    (cfg(transport={"heartbeat_interval_s": 5, "heartbeat_timeout_s": 1}), "must exceed"),
    (cfg(actors=[{"role": "sampler"}]), "actors.0.name: missing required key"),
    (cfg(actors=[{"name": "a", "role": "sampler"}, {"name": "a", "role": "learner"}]), "duplicate actor name 'a'"),
    (cfg(actors=[{"name": "a", "role": "sampler", "address": "tcp://h:1000"},
                 {"name": "b", "role": "sampler", "address": "tcp://h:1000"}]), "duplicate address 'tcp://h:1000'"),
    (cfg(actors=[{"name": "a", "role": "sampler", "address": "tcp://h:1000"},
                 {"name": "b", "role": "sampler", "address": "tcp://h:1001"}]), "duplicate address 'tcp://h:1001'"),
    (cfg(actors=[{"name": "a", "role": "sampler", "address": "http://h:1000"}]), "must start with one of"),
    (cfg(actors=[{"name": "a", "role": "sampler", "address": "tcp://h"}]), "tcp://HOST:PORT"),
    (cfg(actors=[{"name": "a", "role": "sampler", "address": "tcp://h:x:1"}]), "tcp://HOST:PORT"),
    (cfg(actors=[{"name": "a", "role": "Bad Role"}]), "actors.0.role"),
    (cfg(galaxy={"x": 1}), "unknown section [galaxy]"),
    (cfg(model={"num_experts": 4, "top_k": 8}), "top_k (8) must be <= num_experts (4)"),
    (cfg(model={"hidden": 3}), "[model] hidden: unknown key"),
    (cfg(run={"id": "t", "dir": "/tmp/x", "hmac_key": "short"}), "at least 16 characters"),
])
def test_config_errors_name_the_problem(data, needle):
    with pytest.raises(ConfigError) as err:
        parse_config(data, "run.toml")
    assert needle in str(err.value)
    assert str(err.value).startswith("run.toml: ")


class Thing(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    size: int = 3


class ConfigWithThing(RuntimeConfig):
    """A config of the runtime's sections and one more: what a campaign's RunConfig is, in small."""

    thing: Thing = Thing()


def test_a_section_is_read_by_its_model_and_validated_with_the_rest():
    assert parse_runtime(cfg(), "run.toml", ConfigWithThing).section(Thing).size == 3
    assert parse_runtime(cfg(thing={"size": 5}), "run.toml", ConfigWithThing).section(Thing).size == 5
    with pytest.raises(ConfigError, match=r"\[thing\] size"):
        parse_runtime(cfg(thing={"size": "big"}), "run.toml", ConfigWithThing)
    with pytest.raises(ConfigError, match=r"unknown section \[thing\]"):
        parse_runtime(cfg(thing={"size": 5}), "run.toml")
    with pytest.raises(ConfigError, match="no section validated by Thing"):
        parse_runtime(cfg(), "run.toml").section(Thing)


def test_missing_key(monkeypatch):
    monkeypatch.delenv("T1_RUN_KEY", raising=False)
    config = parse_config(cfg(run={"id": "t", "dir": "/tmp/x"}))
    with pytest.raises(ConfigError, match="T1_RUN_KEY"):
        config.hmac_key()
    monkeypatch.setenv("T1_RUN_KEY", "e" * 20)
    assert config.hmac_key() == b"e" * 20


def test_toml_file_errors(tmp_path):
    bad = tmp_path / "run.toml"
    bad.write_text("[run\nid = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    bad.write_text(textwrap.dedent("""
        [run]
        id = "x"
        dir = "/tmp/x"
        [[actors]]
        name = "a"
        role = "sampler"
        adress = "tcp://h:1"
    """))
    with pytest.raises(ConfigError, match=r"actors\.0\.adress: unknown key"):
        load_config(bad)


def test_roles_resolve_lazily_with_clear_errors():
    config = parse_config(cfg(actors=[{"name": "a", "role": "nosuchrole"},
                                      {"name": "b", "role": "echo", "actor_class": "no_such_module_xyz:Echo"},
                                      {"name": "c", "role": "echo", "actor_class": "plugin_actors:EchoActor",
                                       "options": {"x": 1}},
                                      {"name": "d", "role": "wrong", "actor_class": "plugin_actors:EchoActor"}]))
    with pytest.raises(ConfigError, match="unknown role 'nosuchrole'"):
        actor_class(config.actor("a"), ROLES)
    with pytest.raises(ConfigError, match="module no_such_module_xyz does not exist"):
        actor_class(config.actor("b"), ROLES)
    with pytest.raises(ConfigError, match="takes no options"):
        actor_class(config.actor("c"), ROLES).validate_options(config.actor("c"))
    with pytest.raises(ConfigError, match="plays 'echo'"):
        actor_class(config.actor("d"), ROLES)


def test_cli_reports_config_errors(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text('[run]\nid = "x"\ndir = "/tmp/x"\n[[actors]]\nname = "a"\nrole = "echo"\n'
                    'actor_class = "plugin_actors:EchoActor"\n[[actors]]\nname = "a"\nrole = "echo"\n')
    assert cli.main(["check", "--config", str(path)]) == 2
    assert "duplicate actor name 'a'" in capsys.readouterr().err
    assert cli.main(["launch", "--config", str(path)]) == 2


def test_cli_help_lists_roles(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for role in ("sampler", "sandbox", "verifier", "critic", "learner", "staleness", "launch"):
        assert role in out
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert "t1 0.1.0" in capsys.readouterr().out


def test_example_cluster_config_is_valid():
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "example_cluster.toml")
    assert {s.host for s in config.actors} == {"ctl-0", "gpu-0", "gpu-1"}
    assert all(config.control_address(s).startswith("tcp://") for s in config.actors)
    assert [s.name for s in config.actors_of("sampler")] == ["sampler-0", "sampler-1"]


@pytest.mark.parametrize("quick", [False, True])
def test_the_shipped_configs_pass_check(capsys, quick):
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "configs"
    assert cli.main(["check", "--config", str(root / "tiny.toml"), *(["--quick"] if quick else [])]) == 0
    if not quick:  # the cluster config has no [quick.*] tables: --quick is refused there, by name
        assert cli.main(["check", "--config", str(root / "example_cluster.toml")]) == 0
    else:
        assert cli.main(["check", "--config", str(root / "example_cluster.toml"), "--quick"]) == 2
        assert "[quick.*]" in capsys.readouterr().err


@pytest.mark.parametrize("body, keys", [
    ('[ppo]\nadvantage_estimator = "rloo"\n[staleness]\ngroup_size = 1\n',
     ("advantage_estimator", "group_size")),
    ("[sampler]\ntemperature = 0.7\n[ppo]\ntemperature = 1.0\n", ("[sampler] temperature", "[ppo] temperature")),
    ('[ppo]\nactor_params = ["*norm*"]\ncritic_lr = 1e-3\n[learner]\nbackend = "megatron"\n',
     ("actor_params", "backend")),
    ("[campaign]\nmax_context = 4096\n[model]\nmax_position = 2048\n",
     ("[campaign] max_context = 4096", "[model] max_position = 2048", "lower max_context")),
])
def test_every_entry_point_refuses_what_launch_refuses(tmp_path, capsys, body, keys):
    """The rules across sections (RunConfig's validators) run on every load: launch, check and each actor's own
    process (t1-actor ROLE --config ...) refuse the same config, naming both keys."""
    path = tmp_path / "run.toml"
    path.write_text('[run]\nid = "x"\ndir = "' + str(tmp_path / "run") + '"\n[[actors]]\nname = "learner-0"\n'
                    'role = "learner"\n' + body)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert all(key in str(refused.value) for key in keys)
    for argv in (["check", "--config", str(path)], ["launch", "--config", str(path)],
                 ["learner", "--config", str(path), "--name", "learner-0"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert all(key in err for key in keys), (argv, err)


def test_the_learner_temperature_is_the_samplers_unless_set(tmp_path):
    """One key: [ppo] temperature left unset follows [sampler] temperature (and travels to the actors with
    the resolved config); set to another value it is refused (above)."""
    path = tmp_path / "run.toml"
    path.write_text('[run]\nid = "x"\ndir = "' + str(tmp_path / "run") + '"\n[sampler]\ntemperature = 0.7\n')
    config = load_config(path)
    assert config.section(PPOConfig).temperature == 0.7
    assert parse_config(config.to_jsonable()).section(PPOConfig).temperature == 0.7
    path.write_text('[run]\nid = "x"\ndir = "' + str(tmp_path / "run") + '"\n[sampler]\ntemperature = 0.7\n'
                    '[ppo]\ntemperature = 0.7\n')
    assert load_config(path).section(PPOConfig).temperature == 0.7
