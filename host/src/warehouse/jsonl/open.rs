//! Opening a JSON-lines destination: its folder, made if missing, as a
//! cap-std directory nothing can write outside of.

use crate::warehouse::config::Place;
use crate::warehouse::{WriteError, failed};

/// Opens (and makes, when missing) the folder `directory` of the
/// workspace's exports, scoped: nothing outside it can be written.
pub(crate) fn open(directory: &str, place: &Place<'_>) -> Result<cap_std::fs::Dir, WriteError> {
    let path = place.export_dir().join(directory);
    std::fs::create_dir_all(&path).map_err(|e| failed("cannot create the export directory", e))?;
    let dir = cap_std::fs::Dir::open_ambient_dir(&path, cap_std::ambient_authority())
        .map_err(|e| failed("cannot open the export directory", e))?;
    Ok(dir)
}
