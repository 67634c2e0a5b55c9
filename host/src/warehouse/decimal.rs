//! Decimals as a stream's schema declares them (`"format": "decimal"`,
//! with a `precision` and a `scale`) and whether a value fits one:
//! exactly, never rounded. The Iceberg destination stores decimal columns
//! by this rule ([`DecimalType::unscaled`]), and a data contract judges a
//! declared decimal's values by the same rule, so a value the lakehouse
//! would refuse is a breach the contract can keep aside before any of its
//! batch is written.

use std::fmt;

use serde_json::Value;

/// A declared decimal: at most `precision` digits, `scale` of them after
/// the point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecimalType {
    pub(crate) precision: u64,
    pub(crate) scale: u64,
}

/// Why a schema's decimal is not one the service holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeclarationError {
    /// A bound that is not a whole number.
    NotWhole(&'static str),
    /// A precision outside 1 to 38, or a scale past it.
    OutOfRange { precision: u64, scale: u64 },
}

impl fmt::Display for DeclarationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeclarationError::NotWhole(key) => write!(f, "{key} must be a whole number"),
            DeclarationError::OutOfRange { precision, scale } => write!(
                f,
                "decimal({precision},{scale}) is not a decimal the service holds (precision 1 to 38, scale up to it)"
            ),
        }
    }
}

/// Why a value is not a declared decimal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecimalError {
    /// The text is not a number.
    NotANumber(String),
    /// More places after the point than the scale.
    TooManyPlaces { text: String, scale: u64 },
    /// More digits than the precision.
    TooManyDigits { text: String, precision: u64 },
}

impl fmt::Display for DecimalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecimalError::NotANumber(text) => write!(f, "{text} is not a decimal number"),
            DecimalError::TooManyPlaces { text, scale } => write!(f, "{text} has more than {scale} decimal places"),
            DecimalError::TooManyDigits { text, precision } => write!(f, "{text} has more than {precision} digits"),
        }
    }
}

impl DecimalType {
    /// The decimal a field's schema declares (`None` unless its format is
    /// `decimal`): precision 38 and scale 9 (at most the precision) unless
    /// it says otherwise, and no more than 38 digits (what 128 bits hold).
    pub(crate) fn declared(field: &Value) -> Option<Result<DecimalType, DeclarationError>> {
        if field.get("format").and_then(Value::as_str) != Some("decimal") {
            return None;
        }
        let number = |key: &'static str, default: u64| match field.get(key) {
            None => Ok(default),
            Some(v) => v.as_u64().ok_or(DeclarationError::NotWhole(key)),
        };
        Some(number("precision", 38).and_then(|precision| {
            let scale = number("scale", 9.min(precision))?;
            if !(1..=38).contains(&precision) || scale > precision {
                return Err(DeclarationError::OutOfRange { precision, scale });
            }
            Ok(DecimalType { precision, scale })
        }))
    }

    /// A value's text (`-12.5`, `1E-9`) as its unscaled value at this
    /// scale, exactly: more places than the scale, or more digits than
    /// the precision, are refused rather than rounded.
    pub(crate) fn unscaled(&self, text: &str) -> Result<i128, DecimalError> {
        let invalid = || DecimalError::NotANumber(text.to_owned());
        let too_many_digits = || DecimalError::TooManyDigits { text: text.to_owned(), precision: self.precision };
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(i) => (&rest[..i], rest[i + 1..].parse::<i32>().map_err(|_| invalid())?),
            None => (rest, 0),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        if whole.is_empty() && fraction.is_empty() || !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit())
        {
            return Err(invalid());
        }
        let digits: String = format!("{whole}{fraction}").trim_start_matches('0').to_owned();
        let precision = i64::try_from(self.precision).unwrap_or(i64::MAX);
        let scale = i64::try_from(self.scale).unwrap_or(i64::MAX);
        // value = digits × 10^(exponent − fraction digits); unscaled = value × 10^scale.
        let shift = i64::from(exponent).saturating_sub(fraction.len() as i64).saturating_add(scale);
        let digits = if shift >= 0 {
            if digits.is_empty() {
                return Ok(0);
            }
            if (digits.len() as i64).saturating_add(shift) > precision {
                return Err(too_many_digits());
            }
            format!("{digits}{}", "0".repeat(shift as usize))
        } else {
            let cut = usize::try_from(shift.unsigned_abs()).unwrap_or(usize::MAX);
            let (kept, dropped) = digits.split_at(digits.len().saturating_sub(cut));
            if dropped.bytes().any(|b| b != b'0') {
                return Err(DecimalError::TooManyPlaces { text: text.to_owned(), scale: self.scale });
            }
            kept.to_owned()
        };
        if digits.len() as i64 > precision {
            return Err(too_many_digits());
        }
        match digits.as_str() {
            "" => Ok(0),
            digits => {
                let unscaled: i128 = digits.parse().map_err(|_| too_many_digits())?;
                Ok(if negative { -unscaled } else { unscaled })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn d(precision: u64, scale: u64) -> DecimalType {
        DecimalType { precision, scale }
    }

    #[test]
    fn decimals_fit_exactly_or_are_refused() {
        assert_eq!(
            d(38, 9).unscaled("12345678901234567890123456789.123456789"),
            Ok(12345678901234567890123456789123456789)
        );
        assert_eq!(d(38, 9).unscaled("-1E-9"), Ok(-1));
        assert_eq!(d(10, 1).unscaled("1.50"), Ok(15));
        assert_eq!(d(5, 2).unscaled("0.000"), Ok(0));
        assert_eq!(d(6, 2).unscaled("2e3"), Ok(200_000));
        assert_eq!(d(10, 1).unscaled("1.25"), Err(DecimalError::TooManyPlaces { text: "1.25".into(), scale: 1 }));
        assert!(d(5, 0).unscaled("123456").unwrap_err().to_string().contains("5 digits"));
        assert!(d(38, 0).unscaled("1e40").unwrap_err().to_string().contains("38 digits"));
        assert_eq!(d(10, 2).unscaled("1.2.3"), Err(DecimalError::NotANumber("1.2.3".into())));
        assert_eq!(d(10, 2).unscaled("1e99999999999"), Err(DecimalError::NotANumber("1e99999999999".into())));
        assert!(d(10, 2).unscaled("1e-2147483648").is_err());
        for bad in ["", "-", ".", "1.2.3", "abc", "1e", "0x10"] {
            assert!(d(38, 9).unscaled(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_declared_decimal_reads_its_bounds_or_the_defaults() {
        assert_eq!(DecimalType::declared(&json!({ "type": "number" })), None);
        assert_eq!(DecimalType::declared(&json!({ "format": "decimal" })), Some(Ok(d(38, 9))));
        assert_eq!(DecimalType::declared(&json!({ "format": "decimal", "precision": 4 })), Some(Ok(d(4, 4))));
        assert_eq!(
            DecimalType::declared(&json!({ "format": "decimal", "precision": 10, "scale": 2 })),
            Some(Ok(d(10, 2)))
        );
        assert_eq!(
            DecimalType::declared(&json!({ "format": "decimal", "scale": -1 })),
            Some(Err(DeclarationError::NotWhole("scale")))
        );
        assert_eq!(
            DecimalType::declared(&json!({ "format": "decimal", "precision": 39 })),
            Some(Err(DeclarationError::OutOfRange { precision: 39, scale: 9 }))
        );
        assert!(
            DecimalType::declared(&json!({ "format": "decimal", "precision": 4, "scale": 5 }))
                .unwrap()
                .unwrap_err()
                .to_string()
                .contains("decimal(4,5)")
        );
    }
}
