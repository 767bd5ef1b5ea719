import configparser
from pathlib import Path

CONFIG = "/opt/service/config.ini"


def parsed():
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    return parser


def test_port_changed():
    assert parsed()["server"]["port"] == "9090"


def test_log_level_changed():
    assert parsed()["logging"]["log_level"] == "info"


def test_other_settings_kept():
    config = parsed()
    assert config["server"]["host"] == "0.0.0.0"
    assert config["logging"]["file"] == "/var/log/service.log"


def test_show_port_output_saved():
    assert Path("/app/port.txt").read_text().strip() == "9090"
