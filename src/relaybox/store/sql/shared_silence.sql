-- Silence's statements both backends run as written (sql/<backend>_silence.sql has
-- the others).

-- name: silence_states
SELECT kind, name, last_seen, expected, silent_since, learned, learned_at, checked_at
FROM relaybox_silences WHERE kind = 'source'
ORDER BY kind, name
