#!/bin/sh
# Temporal's schema on a new PostgreSQL database (deploy/compose.postgres.yaml's temporal-schema
# job, in the temporalio/admin-tools image). The steps are those of Temporal's own Compose
# sample for PostgreSQL; run it once per database (a second run stops at the create of a
# database that exists: nothing is changed). Needs Docker: not run on the machines this
# project is built on.
set -eu

sql() {
    temporal-sql-tool --plugin "$DB" --ep "$POSTGRES_SEEDS" -u "$POSTGRES_USER" -p "$DB_PORT" "$@"
}

# The PostgreSQL image has already created the database named after its user (`temporal`).
sql --db temporal_visibility create
for db in temporal:temporal temporal_visibility:visibility; do
    name=${db%%:*}
    schema=${db#*:}
    sql --db "$name" setup-schema -v 0.0
    sql --db "$name" update-schema -d "/etc/temporal/schema/postgresql/v12/$schema/versioned"
done
echo "Temporal's schema is set up in temporal and temporal_visibility"
