#!/usr/bin/env python3
"""Prints a YAML file (compose.yaml) as JSON on stdout, for compose_check.

Stricter than Compose where a lenient read would hide a mistake: a duplicate key, a key that is
not a string (`on:`, `1:`) or a value JSON cannot hold (a date) is an error, exit 1. PyYAML reads
YAML 1.1, so an unquoted `no` or `8080:80` becomes a boolean or a number: the schema then refuses
it, as it should (Compose reads them differently again; quote such values).
"""
import json
import sys

import yaml


class StrictLoader(yaml.SafeLoader):
    pass


def construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # "<<: *anchor": the mapping's own keys override the merged ones
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is not a string (quote it)", key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading the mapping", seen[key], f"duplicate key {key!r}", key_node.start_mark)
        seen[key] = key_node.start_mark
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)


def main():
    if len(sys.argv) != 2:
        print("usage: yaml_to_json.py FILE.yaml", file=sys.stderr)
        return 2
    path = sys.argv[1]
    try:
        with open(path, encoding="utf-8") as f:
            document = yaml.load(f, Loader=StrictLoader)
        text = json.dumps(document, allow_nan=False)
    except (OSError, yaml.YAMLError, TypeError, ValueError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
