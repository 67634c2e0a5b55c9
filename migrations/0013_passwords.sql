-- Passwords for web sign-in: an Argon2id hash in PHC form (algorithm,
-- parameters, salt and hash in one text), NULL while the user has none.
ALTER TABLE users ADD COLUMN password_hash TEXT;
