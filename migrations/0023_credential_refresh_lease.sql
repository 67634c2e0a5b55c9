-- One server at a time refreshes an OAuth credential's access token: a
-- provider that rotates refresh tokens on use refuses the second of two
-- refreshes with the same refresh token, and the grant would be lost. A
-- server takes the lease (until the time stored here, Unix ms), reads the
-- credential again, refreshes and stores; the others wait for what it
-- stored.
ALTER TABLE credentials ADD COLUMN refreshing_until BIGINT;
