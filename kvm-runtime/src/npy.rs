//! Writes float32 `.npy` files (NumPy format 1.0).

use std::io::Write;

/// Writes the header of a little-endian float32 `.npy` of `shape` (row-major): the
/// `shape.iter().product()` values follow, written with [`write_values`] as they come.
///
/// # Errors
/// I/O errors.
pub fn write_header(mut w: impl Write, shape: &[usize]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n' is padded to a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    w.write_all(b"\x93NUMPY\x01\x00")?;
    w.write_all(&(header.len() as u16).to_le_bytes())?;
    w.write_all(header.as_bytes())
}

/// Appends `data` to a `.npy` begun with [`write_header`].
///
/// # Errors
/// I/O errors.
pub fn write_values(mut w: impl Write, data: &[f32]) -> std::io::Result<()> {
    for v in data {
        w.write_all(&v.to_le_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_is_aligned_and_data_follows() {
        let mut out = Vec::new();
        super::write_header(&mut out, &[2, 3]).unwrap();
        super::write_values(&mut out, &[1.0, 2.0, 3.0]).unwrap();
        super::write_values(&mut out, &[4.0, 5.0, 6.0]).unwrap();
        let hlen = u16::from_le_bytes([out[8], out[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&out[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 3)"));
        assert_eq!(out.len(), 10 + hlen + 24);
        assert_eq!(f32::from_le_bytes(out[10 + hlen + 20..].try_into().unwrap()), 6.0);
    }
}
