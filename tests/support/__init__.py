"""Helpers that build real test inputs and start real servers on 127.0.0.1."""
