//! Reading members out of wheels (zip) and npm tarballs (gzipped ustar).

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
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(BufReader::new(file))
        .read_to_end(&mut tar)
        .map_err(|e| bad_archive(path, e))?;
    parse_tar(&tar).map_err(|e| bad_archive(path, e))
}

/// Minimal ustar reader: regular files (with the ustar prefix and GNU long
/// names honoured); directories, links and pax headers are skipped.
pub(crate) fn parse_tar(tar: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    fn text(field: &[u8]) -> String {
        let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
        String::from_utf8_lossy(&field[..end]).into_owned()
    }
    let mut files = Vec::new();
    let mut long_name = None;
    let mut pos = 0;
    loop {
        let header = tar
            .get(pos..pos + 512)
            .ok_or_else(|| format!("tar truncated at offset {pos} (no end-of-archive block)"))?;
        if header.iter().all(|&b| b == 0) {
            break;
        }
        let size_field = text(&header[124..136]);
        let size = usize::from_str_radix(size_field.trim_matches([' ', '\0']), 8)
            .map_err(|_| format!("bad tar size field {size_field:?} at offset {pos}"))?;
        let start = pos + 512;
        let data = tar
            .get(start..start + size)
            .ok_or_else(|| format!("tar truncated at offset {pos}"))?;
        let mut name = text(&header[..100]);
        if &header[257..262] == b"ustar" {
            let prefix = text(&header[345..500]);
            if !prefix.is_empty() {
                name = format!("{prefix}/{name}");
            }
        }
        match header[156] {
            b'0' | 0 => files.push((long_name.take().unwrap_or(name), data.to_vec())),
            b'L' => long_name = Some(text(data)),
            _ => {}
        }
        pos = start + size.div_ceil(512) * 512;
    }
    Ok(files)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ustar archive of regular files, for tests.
    pub(crate) fn make_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = Vec::new();
        for (name, data) in files {
            let mut h = [0u8; 512];
            h[..name.len()].copy_from_slice(name.as_bytes());
            h[100..108].copy_from_slice(b"0000644\0");
            h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
            h[156] = b'0';
            h[257..263].copy_from_slice(b"ustar\0");
            h[148..156].copy_from_slice(b"        ");
            let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
            h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
            tar.extend_from_slice(&h);
            tar.extend_from_slice(data);
            tar.resize(tar.len().div_ceil(512) * 512, 0);
        }
        tar.resize(tar.len() + 1024, 0);
        tar
    }

    #[test]
    fn tar_roundtrip() {
        let big = vec![7u8; 1000];
        let tar = make_tar(&[
            ("package/a", b"hello"),
            ("package/b", &big),
            ("package/empty", b""),
        ]);
        let files = parse_tar(&tar).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(files[0], ("package/a".to_owned(), b"hello".to_vec()));
        assert_eq!(files[1].1, big);
        assert!(files[2].1.is_empty());
        assert!(
            parse_tar(&tar[..600]).is_err(),
            "truncated archive must fail"
        );
    }
}
