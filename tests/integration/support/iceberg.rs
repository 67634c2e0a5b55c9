//! Reading Iceberg tables back as other engines do: [`Reader`], a
//! pyiceberg and DuckDB process fed one request a line.

use super::{python_script, test_python};

/// pyiceberg and DuckDB reading tables as an engine outside the service
/// does: one `iceberg_read.py --serve` for the whole test.
pub(crate) struct Reader {
    child: tokio::process::Child,
    input: tokio::process::ChildStdin,
    output: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Reader {
    pub(crate) fn start() -> Reader {
        let mut child = tokio::process::Command::new(test_python())
            .arg(python_script("iceberg_read.py"))
            .arg("--serve")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let output = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().unwrap()));
        Reader { child, input, output }
    }

    /// What pyiceberg and DuckDB read of `table` through pyiceberg's SQL
    /// catalog `catalog` on the control database at `database_url`.
    pub(crate) async fn read(
        &mut self,
        database_url: &str,
        catalog: &str,
        table: &str,
        properties: serde_json::Value,
    ) -> serde_json::Value {
        self.read_with(database_url, catalog, table, properties, &[]).await
    }

    /// [`Reader::read`], each row also showing `columns` as text.
    pub(crate) async fn read_with(
        &mut self,
        database_url: &str,
        catalog: &str,
        table: &str,
        properties: serde_json::Value,
        columns: &[&str],
    ) -> serde_json::Value {
        let uri = match database_url.strip_prefix("sqlite://") {
            Some(path) => format!("sqlite:///{}", path.split('?').next().unwrap()),
            None => database_url.replacen("postgres://", "postgresql+psycopg2://", 1),
        };
        let request = format!("{}\n", serde_json::json!([uri, catalog, table, properties, columns]));
        tokio::io::AsyncWriteExt::write_all(&mut self.input, request.as_bytes()).await.unwrap();
        match self.output.next_line().await.unwrap() {
            Some(line) => serde_json::from_str(&line).unwrap(),
            None => panic!("iceberg_read.py stopped: {:?}", self.child.wait().await),
        }
    }
}
