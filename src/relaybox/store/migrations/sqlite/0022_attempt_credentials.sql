-- The attempt log no longer keeps credentials: relaybox records the value of every
-- request header named as one (the Authorization an endpoint's Basic, bearer or OAuth2
-- credentials add; an X-Api-Key, Cookie, ... among an endpoint's custom headers or an
-- HttpChannel's: a name holding auth, token, secret, passw, apikey, api-key, api_key,
-- cookie, session or credential, relaybox.outbound.channels.http.CREDENTIAL_WORDS) and
-- of a receiver's Set-Cookie as "[redacted]". The attempts earlier versions recorded
-- are redacted the same way here, each field kept in its place. Only rows naming such a
-- header with a value not yet redacted are rewritten, in one statement.
UPDATE relaybox_outbox_attempts
SET headers = json_object(
    'request', (
        SELECT json_group_array(
            CASE WHEN EXISTS (
                     SELECT 1 FROM json_each('["auth", "token", "secret", "passw", "apikey",
                         "api-key", "api_key", "cookie", "session", "credential"]') AS w
                     WHERE instr(lower(json_extract(f.value, '$[0]')), w.value) > 0
                 )
                 THEN json_array(json_extract(f.value, '$[0]'), '[redacted]')
                 ELSE json(f.value) END)
        FROM json_each(relaybox_outbox_attempts.headers, '$.request') AS f
    ),
    'response', (
        SELECT json_group_array(
            CASE WHEN lower(json_extract(f.value, '$[0]')) = 'set-cookie'
                 THEN json_array(json_extract(f.value, '$[0]'), '[redacted]')
                 ELSE json(f.value) END)
        FROM json_each(relaybox_outbox_attempts.headers, '$.response') AS f
    )
)
WHERE headers IS NOT NULL AND json_valid(headers)
  AND (
    EXISTS (
        SELECT 1 FROM json_each(relaybox_outbox_attempts.headers, '$.request') AS f,
            json_each('["auth", "token", "secret", "passw", "apikey", "api-key", "api_key",
                "cookie", "session", "credential"]') AS w
        WHERE instr(lower(json_extract(f.value, '$[0]')), w.value) > 0
          AND json_extract(f.value, '$[1]') IS NOT '[redacted]'
    )
    OR EXISTS (
        SELECT 1 FROM json_each(relaybox_outbox_attempts.headers, '$.response') AS f
        WHERE lower(json_extract(f.value, '$[0]')) = 'set-cookie'
          AND json_extract(f.value, '$[1]') IS NOT '[redacted]'
    )
  );
