"""The LMDB store: one daemon's ledger in a memory-mapped file under its data
directory (`store`), group-committed and durable by default; its views,
answers, format upgrades and offline restore. Opened through `entry`."""
