"""Generated from protos/effectd/v1 by scripts/gen_protos.py; do not edit."""
