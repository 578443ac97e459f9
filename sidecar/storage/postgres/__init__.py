"""The PostgreSQL store: one ledger shared by many daemons (`store`); its
views, schema and migrations, fault handling and the marking of a database
restored by its own tools. Opened through `entry`; nothing here is imported
by a daemon of another store."""
