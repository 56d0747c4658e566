"""Server addresses as C{--server}, C{JESYNC_SERVERS} and the clients take them."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from jesync.client.address import DEFAULT_PORT, TCPAddress, UNIXAddress, parse_address, parse_servers


class ParseAddressTests(SynchronousTestCase):
    def test_forms(self) -> None:
        """host:port, bare host (port 11400), [IPv6]:port, bare IPv6, unix:/path."""
        cases = {
            "example.com:7777": TCPAddress("example.com", 7777),
            "127.0.0.1": TCPAddress("127.0.0.1", DEFAULT_PORT),
            "[::1]:11401": TCPAddress("::1", 11401),
            "[::1]": TCPAddress("::1", DEFAULT_PORT),
            "::1": TCPAddress("::1", DEFAULT_PORT),
            "unix:/run/jesync.sock": UNIXAddress("/run/jesync.sock"),
            " localhost:1 ": TCPAddress("localhost", 1),
        }
        for text, expected in cases.items():
            self.assertEqual(parse_address(text), expected, text)
        self.assertEqual(DEFAULT_PORT, 11400)

    def test_written_back(self) -> None:
        """str() writes an address the way it is parsed, brackets included."""
        for text in ["example.com:7777", "[::1]:11400", "unix:/tmp/j.sock"]:
            self.assertEqual(str(parse_address(text)), text)
        self.assertEqual(str(parse_address("db1")), "db1:11400")

    def test_bad(self) -> None:
        for text in ["", ":11400", "host:", "host:0", "host:65536", "host:http", "[::1", "[::1]11400", "unix:", "[]:1"]:
            self.assertRaises(ValueError, parse_address, text)


class ParseServersTests(SynchronousTestCase):
    def test_string_of_several(self) -> None:
        """Commas and whitespace separate addresses; the order is kept."""
        self.assertEqual(
            parse_servers("b:2, a:1 [::1]:3,unix:/s"),
            [TCPAddress("b", 2), TCPAddress("a", 1), TCPAddress("::1", 3), UNIXAddress("/s")],
        )

    def test_list(self) -> None:
        self.assertEqual(parse_servers(["a", TCPAddress("b", 1)]), [TCPAddress("a", 11400), TCPAddress("b", 1)])

    def test_none_or_repeated(self) -> None:
        self.assertRaises(ValueError, parse_servers, "")
        self.assertRaises(ValueError, parse_servers, [])
        self.assertRaises(ValueError, parse_servers, "a:11400,a")
