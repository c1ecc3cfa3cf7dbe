//! Reading members out of wheels (zip, the `zip` crate) and npm tarballs
//! (gzipped tar, `flate2` and the `tar` crate).

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use crate::FetchError;

fn bad_archive(path: &Path, message: impl ToString) -> FetchError {
    FetchError::Archive {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// Appends every member of the zip at `path` whose name starts with `prefix`
/// (directories excluded) to `out`, in name order. Errors if none matches.
pub(crate) fn copy_zip_members(
    path: &Path,
    prefix: &str,
    out: &mut dyn Write,
) -> Result<u64, FetchError> {
    let file = File::open(path).map_err(|e| FetchError::io(path, e))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| bad_archive(path, e))?;
    let mut names: Vec<String> = zip
        .file_names()
        .filter(|n| n.starts_with(prefix) && !n.ends_with('/'))
        .map(str::to_owned)
        .collect();
    if names.is_empty() {
        return Err(FetchError::MissingMember {
            path: path.to_path_buf(),
            prefix: prefix.to_owned(),
        });
    }
    names.sort();
    let mut total = 0;
    for name in &names {
        let mut member = zip.by_name(name).map_err(|e| bad_archive(path, e))?;
        // The zip reader checks each member's CRC-32 when it reaches the end.
        total +=
            io::copy(&mut member, out).map_err(|e| bad_archive(path, format!("{name}: {e}")))?;
    }
    Ok(total)
}

/// The regular files of a `.tgz`, as (path, contents), in archive order.
pub(crate) fn read_tgz(path: &Path) -> Result<Vec<(String, Vec<u8>)>, FetchError> {
    let file = File::open(path).map_err(|e| FetchError::io(path, e))?;
    read_tar(flate2::read::GzDecoder::new(BufReader::new(file))).map_err(|e| bad_archive(path, e))
}

/// The regular files of a tar stream (ustar, GNU long names and pax
/// headers, read by the `tar` crate); directories and links are skipped.
/// A member shorter than its header says is an error, not a short file.
pub(crate) fn read_tar(stream: impl Read) -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut archive = tar::Archive::new(stream);
    let mut files = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let size = entry.size();
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        if data.len() as u64 != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{name}: {} of {size} bytes (truncated archive)", data.len()),
            ));
        }
        files.push((name, data));
    }
    Ok(files)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tar archive of regular files, for tests.
    pub(crate) fn make_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            tar.append_data(&mut header, name, *data).unwrap();
        }
        tar.into_inner().unwrap()
    }

    #[test]
    fn tar_roundtrip() {
        let big = vec![7u8; 1000];
        let long = format!("package/{}.txt", "x".repeat(150));
        let tar = make_tar(&[
            ("package/a", b"hello"),
            ("package/b", &big),
            ("package/empty", b""),
            (&long, b"long name"),
        ]);
        let files = read_tar(&tar[..]).unwrap();
        assert_eq!(files.len(), 4);
        assert_eq!(files[0], ("package/a".to_owned(), b"hello".to_vec()));
        assert_eq!(files[1], ("package/b".to_owned(), big.clone()));
        assert_eq!(files[2], ("package/empty".to_owned(), Vec::new()));
        assert_eq!(files[3], (long, b"long name".to_vec()));
        // Cut inside `package/b`'s data (its header is the third block).
        let cut = read_tar(&tar[..512 * 3 + 600]);
        assert!(cut.is_err(), "a truncated archive must fail: {cut:?}");
    }
}
