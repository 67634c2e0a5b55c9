//! `service`: parses the command line and hands over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    // TLS for outbound requests uses ring; install it before any client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut cli = service::cli::Cli::parse();
    // Before any thread exists: the PostgreSQL driver would read the
    // server's own PG* settings for every connection, tenants' destinations
    // included. They are moved into the control database's URL, where they
    // belong, and out of the environment.
    if let Err(e) =
        service::config::isolate_postgres_environment(cli.storage_mut().and_then(|s| s.database_url.as_mut()))
    {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(service::cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            // API errors, network errors and the rest exit differently
            // (usage errors exit 2, from the parser).
            match e.downcast_ref::<service::cli::client::CliFailure>() {
                Some(f) => std::process::ExitCode::from(f.exit_code()),
                None => std::process::ExitCode::FAILURE,
            }
        }
    }
}
