"""Temporary: the old home of the v2 wire format, kept only until its last importer moves.

``tests/bench/test_payload.py`` still imports the request parser from here; it should import
from :mod:`carpool.server.requests`, after which this module is deleted. New code imports
from where things live: :mod:`carpool.server.messages` (records, ``ProtocolError``),
:mod:`carpool.server.requests` (parsing), :mod:`carpool.server.responses` (encoding).
"""

from carpool.server.requests import parse_header_length, parse_infer_request

__all__ = ["parse_header_length", "parse_infer_request"]
