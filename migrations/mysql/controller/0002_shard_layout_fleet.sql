-- One fleet per database (PostgreSQL 0003): the shard layout records the
-- fleet that owns the database (its --fleet), and a replica of another
-- fleet refuses to start. NULL is a layout an older version recorded; the
-- first replica to see it adopts it. MySQL 8 has no ADD COLUMN IF NOT
-- EXISTS (MariaDB has), and 0001 creates shard_layout only IF NOT EXISTS,
-- so a 0.2.0 table lacks the column: a throw-away procedure adds it when
-- information_schema does not show it.
DROP PROCEDURE IF EXISTS autoapproval_add_shard_layout_fleet;
CREATE PROCEDURE autoapproval_add_shard_layout_fleet()
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                    WHERE table_schema = DATABASE()
                      AND table_name = 'shard_layout'
                      AND column_name = 'fleet') THEN
        ALTER TABLE shard_layout ADD COLUMN fleet VARCHAR(255) NULL;
    END IF;
END;
CALL autoapproval_add_shard_layout_fleet();
DROP PROCEDURE autoapproval_add_shard_layout_fleet;
