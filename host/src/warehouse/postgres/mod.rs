//! PostgreSQL warehouses: where a destination may connect, and how.
//!
//! A destination's URL is a tenant's input, and the connection is made by
//! the host, from inside the operator's network, possibly with a stored
//! password. So the URL is not handed to the driver: it is taken apart into
//! host, port, database, user and a TLS mode, anything else is refused
//! (`host=`, `hostaddr=`, `options=`, `sslkey=`, a socket path, a password
//! parameter ...), and the connection options are built from those parts
//! alone, without the server's own `PG*` environment or `~/.pgpass`.
//!
//! The address policy is the egress's one ([`Reach::Warehouses`](crate::egress::Reach::Warehouses)): a host
//! must be one the operator allows ([`WarehousePolicy`]), and every
//! address it resolves to must be a global one unless the operator named
//! the address or its network. A connection that sends a password verifies the
//! server's certificate and name (`verify-full`).
//!
//! Layout (the role files every kind has):
//! - [`config`]: the configuration's fields and their check, the URL taken
//!   apart ([`Target`]);
//! - [`open`]: connect options under the address policy, and the pool of
//!   one job;
//! - [`batch`]: rows in the binary `COPY` format, and their [`apply`].

pub(crate) mod batch;
pub(crate) mod config;
pub(crate) mod open;

pub(crate) use batch::apply;
pub(in crate::warehouse) use batch::copy_data;
pub(crate) use config::Target;
pub use config::WarehousePolicy;
pub(crate) use config::{FIELDS, config};
pub(in crate::warehouse) use open::POSTGRES_CONNECTIONS;
pub(crate) use open::{connect_options, open};
