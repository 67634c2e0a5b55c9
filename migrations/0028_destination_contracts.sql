-- A destination's default data contract: what a pipeline stream writing
-- to it does with records that do not fit its schema when the stream
-- names no contract of its own (JSON, as a stream's contract; NULL: none).
ALTER TABLE destinations ADD COLUMN default_contract TEXT;
