-- revealed_at: when the tenant portal showed this signing secret to the tenant. The
-- portal shows each secret once (when the endpoint is made or the secret rotated there,
-- or on the first "Reveal secret"); NULL: never shown in the portal.
ALTER TABLE relaybox_endpoint_secrets ADD COLUMN revealed_at DOUBLE PRECISION;
