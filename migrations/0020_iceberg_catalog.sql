-- The Iceberg SQL catalog of the lakehouse destinations, in the control
-- database: one catalog per destination (its id as catalog_name), laid
-- out as the SQL catalogs of pyiceberg and iceberg-rust lay it out, so
-- those readers open the same tables. A commit is a compare-and-set of
-- metadata_location: of two writers racing, one wins and the other
-- retries on the new metadata.
CREATE TABLE iceberg_tables (
    catalog_name                VARCHAR(255) NOT NULL,
    table_namespace             VARCHAR(255) NOT NULL,
    table_name                  VARCHAR(255) NOT NULL,
    metadata_location           VARCHAR(1000),
    previous_metadata_location  VARCHAR(1000),
    iceberg_type                VARCHAR(5),
    PRIMARY KEY (catalog_name, table_namespace, table_name)
);

CREATE TABLE iceberg_namespace_properties (
    catalog_name    VARCHAR(255) NOT NULL,
    namespace       VARCHAR(255) NOT NULL,
    property_key    VARCHAR(255) NOT NULL,
    property_value  VARCHAR(1000),
    PRIMARY KEY (catalog_name, namespace, property_key)
);
