"""Defragmentation: move GPU workers off lightly used nodes so that the nodes empty and can be released."""
