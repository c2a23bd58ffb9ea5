"""Broker URLs with a client certificate: ``mqtts://...?ca=PATH&cert=PATH&key=PATH``."""

from __future__ import annotations

import pytest

from hulk.errors import ConfigError
from hulk.wire.broker import client_tls_kwargs, parse_broker_url


def test_cert_and_key_are_read_from_the_query():
    broker = parse_broker_url("mqtts://n1:pw@broker:8883?ca=/etc/hulk/tls/ca.pem"
                              "&cert=/etc/hulk/tls/n1.pem&key=/etc/hulk/tls/n1.key")
    assert (broker.ca, broker.cert, broker.key) == ("/etc/hulk/tls/ca.pem",
                                                    "/etc/hulk/tls/n1.pem", "/etc/hulk/tls/n1.key")
    params = client_tls_kwargs(broker)["tls_params"]
    assert (params.ca_certs, params.certfile, params.keyfile) == (broker.ca, broker.cert,
                                                                  broker.key)
    assert "pw" not in repr(broker)
    without_ca = parse_broker_url("mqtts://broker?cert=/c.pem&key=/k.pem")
    assert without_ca.ca is None and without_ca.cert == "/c.pem"
    plain = parse_broker_url("mqtts://broker?ca=/ca.pem")
    assert plain.cert is None and plain.key is None


@pytest.mark.parametrize("url", [
    "mqtts://broker?cert=/c.pem",                    # a certificate without its key
    "mqtts://broker?key=/k.pem",
    "mqtt://broker?cert=/c.pem&key=/k.pem",          # client certificates need TLS
    "mqtts://broker?cert=&key=/k.pem",
    "mqtts://broker?cert=/a&cert=/b&key=/k.pem",
    "mqtts://broker?ca=/ca.pem&password=x",
])
def test_bad_client_certificate_urls_are_config_errors(url):
    with pytest.raises(ConfigError, match="--mqtt: expected mqtt://"):
        parse_broker_url(url)
