#!/usr/bin/env python3
"""schema_validate.py - the JSON Schema editors use must agree with mgc.

Every config mgc accepts (models/, examples/, tests/good/) must validate
against docs/mgc-config.schema.json, and the schema-level mistakes of the
golden corpus (unknown keys, wrong types, out-of-range values, unknown enum
names) must be rejected by it.  The schema cannot express cross-key rules;
those are mgc check's job.  Exit 77 (skipped) when jsonschema or PyYAML is
missing.  Prints "schema_validate: N passed, M failed".
"""
import glob
import json
import sys

try:
    import jsonschema
    import yaml
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"schema_validate: skipped ({e})")
    sys.exit(77)

schema = json.load(open("docs/mgc-config.schema.json"))
jsonschema.Draft202012Validator.check_schema(schema)
validator = jsonschema.Draft202012Validator(schema)

# mgc accepts enum names case-insensitively with '_' for '-'; the schema lists
# the canonical spelling, which is what every committed file uses.
accepted = sorted(glob.glob("models/*.yaml") + glob.glob("examples/*.yaml") + glob.glob("tests/good/*.yaml"))
rejected = ["tests/bad/unknown-key.yaml", "tests/bad/unknown-section.yaml", "tests/bad/wrong-type.yaml",
            "tests/bad/out-of-range.yaml", "tests/bad/bad-enum.yaml"]

passed = failed = 0
for path in accepted:
    doc = yaml.safe_load(open(path)) or {}
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        failed += 1
        for e in errors[:3]:
            print(f"{path}: schema rejects a config mgc accepts: {'.'.join(map(str, e.path))}: {e.message}")
    else:
        passed += 1
for path in rejected:
    doc = yaml.safe_load(open(path)) or {}
    if validator.is_valid(doc):
        failed += 1
        print(f"{path}: schema accepts a config mgc rejects")
    else:
        passed += 1
print(f"schema_validate: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
