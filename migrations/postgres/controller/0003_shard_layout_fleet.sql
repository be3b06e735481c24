-- One fleet per database: the shard layout records the fleet that owns
-- the database (its --fleet), and a replica of another fleet refuses to
-- start. NULL is a layout an older version recorded; the first replica to
-- see it adopts it. ADD COLUMN IF NOT EXISTS: 0001 creates shard_layout
-- only IF NOT EXISTS, so a 0.2.0 table lacks the column.
ALTER TABLE shard_layout ADD COLUMN IF NOT EXISTS fleet TEXT;
