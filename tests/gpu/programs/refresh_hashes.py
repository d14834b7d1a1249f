"""Rewrite each helper program's manifest ``source_hash`` after its program.cu changed.

    python tests/gpu/programs/refresh_hashes.py

The GPU tests expect no manifest-hash warning, so run this after editing any program.cu here.
"""

import hashlib
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

for manifest in sorted(HERE.glob("*/manifest.json")):
    data = json.loads(manifest.read_text())
    digest = hashlib.sha256((manifest.parent / "program.cu").read_bytes()).hexdigest()
    if data.get("source_hash") != digest:
        data["source_hash"] = digest
        manifest.write_text(json.dumps(data, indent=2) + "\n")
        print(f"updated {manifest.relative_to(HERE)}")
