"""Tests: pure logic first, then assets with real resources, then real servers on loopback."""
