#!/bin/sh
# Runs once, on the first start of an empty data volume (the postgres image runs the files in
# /docker-entrypoint-initdb.d/). Creates a role and a database each for Prefect and MLflow, with
# the passwords from docker/.env, and the pg_trgm extension Prefect's migrations need.
set -eu

: "${PREFECT_DB_PASSWORD:?PREFECT_DB_PASSWORD is not set (docker/.env)}"
: "${MLFLOW_DB_PASSWORD:?MLFLOW_DB_PASSWORD is not set (docker/.env)}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v prefect_password="$PREFECT_DB_PASSWORD" \
    -v mlflow_password="$MLFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE prefect LOGIN PASSWORD :'prefect_password';
CREATE ROLE mlflow LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE prefect OWNER prefect;
CREATE DATABASE mlflow OWNER mlflow;
\connect prefect
CREATE EXTENSION IF NOT EXISTS pg_trgm;
SQL
