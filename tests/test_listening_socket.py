"""fedveil/ops/listening.py: the one place the coordinator and `fedveil serve` bind their
listening ports (it was written twice, in server/coordinator/launch.py and
server/serving/prediction_server.py)."""

from __future__ import annotations

import socket

import pytest

from fedveil.config import ConfigError
from fedveil.ops.listening import listening_socket


def test_port_0_listens_on_the_port_the_os_chose_and_a_child_can_inherit_it():
    with listening_socket("127.0.0.1", 0) as sock:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        assert sock.get_inheritable()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it accepts connections before any server runs


def test_a_taken_port_is_a_config_error_naming_the_address():
    with listening_socket("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^cannot listen on 127\.0\.0\.1:{port}: "):
            listening_socket("127.0.0.1", port)


def test_an_address_this_host_does_not_have_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"^cannot listen on 192\.0\.2\.1:0: "):
        listening_socket("192.0.2.1", 0)  # TEST-NET-1: never a local address
