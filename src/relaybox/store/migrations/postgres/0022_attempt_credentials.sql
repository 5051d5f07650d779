-- The attempt log no longer keeps credentials: relaybox records the value of every
-- request header named as one (the Authorization an endpoint's Basic, bearer or OAuth2
-- credentials add; an X-Api-Key, Cookie, ... among an endpoint's custom headers or an
-- HttpChannel's: a name holding auth, token, secret, passw, apikey, api-key, api_key,
-- cookie, session or credential, relaybox.outbound.channels.http.CREDENTIAL_WORDS) and
-- of a receiver's Set-Cookie as "[redacted]". The attempts earlier versions recorded
-- are redacted the same way here, each field kept in its place. Only rows naming such a
-- header with a value not yet redacted are rewritten (the text test first, then the
-- fields), in one statement: an attempt row is never updated once written, so nothing
-- but retention waits for the rows it locks.
UPDATE relaybox_outbox_attempts AS a
SET headers = json_build_object(
    'request', (
        SELECT coalesce(json_agg(
            CASE WHEN lower(e.f ->> 0)
                      ~ 'auth|token|secret|passw|apikey|api-key|api_key|cookie|session|credential'
                 THEN json_build_array(e.f -> 0, '[redacted]'::text)
                 ELSE e.f END
            ORDER BY e.n), '[]'::json)
        FROM json_array_elements(a.headers::json -> 'request') WITH ORDINALITY AS e (f, n)
    ),
    'response', (
        SELECT coalesce(json_agg(
            CASE WHEN lower(e.f ->> 0) = 'set-cookie'
                 THEN json_build_array(e.f -> 0, '[redacted]'::text)
                 ELSE e.f END
            ORDER BY e.n), '[]'::json)
        FROM json_array_elements(a.headers::json -> 'response') WITH ORDINALITY AS e (f, n)
    )
)::text
WHERE a.headers ~* 'auth|token|secret|passw|api.?key|cookie|session|credential'
  AND (
    EXISTS (
        SELECT 1 FROM json_array_elements(a.headers::json -> 'request') AS e (f)
        WHERE lower(e.f ->> 0)
                  ~ 'auth|token|secret|passw|apikey|api-key|api_key|cookie|session|credential'
          AND e.f ->> 1 IS DISTINCT FROM '[redacted]'
    )
    OR EXISTS (
        SELECT 1 FROM json_array_elements(a.headers::json -> 'response') AS e (f)
        WHERE lower(e.f ->> 0) = 'set-cookie' AND e.f ->> 1 IS DISTINCT FROM '[redacted]'
    )
  );
