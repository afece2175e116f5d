#!/bin/sh
# Run by lockrun: write the report only if no holder with a newer fencing token has
# written already (an older holder that wakes up late is refused by the database).
set -eu
: "${LOCKRUN_FENCING_TOKEN:?run me under lockrun}"
written=$(psql "${DATABASE_URL:-postgresql://127.0.0.1/test}" -X -q -t -A \
  -v ON_ERROR_STOP=1 -v token="$LOCKRUN_FENCING_TOKEN" <<'SQL'
SET client_min_messages = warning;
CREATE TABLE IF NOT EXISTS report (id int PRIMARY KEY, fence bigint NOT NULL, body text);
INSERT INTO report VALUES (1, 0, NULL) ON CONFLICT (id) DO NOTHING;
UPDATE report SET body = 'made at ' || now(), fence = :'token'
 WHERE id = 1 AND fence < :'token'
RETURNING fence;
SQL
)
if [ -z "$written" ]; then
  echo "stale fencing token $LOCKRUN_FENCING_TOKEN: a newer holder has written; nothing changed" >&2
  exit 1
fi
echo "wrote the report with fencing token $written"
