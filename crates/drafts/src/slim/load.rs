//! Recognising a slim draft when it is loaded.

use arbor_gguf::Header;
use arbor_model::LanguageModel;

use super::{KEY_TOKEN_IDS, SlimDraft};
use crate::DraftError;

/// The kept token ids of a slim draft GGUF (its [`KEY_TOKEN_IDS`]), `None`
/// for any other GGUF.
pub fn slim_token_ids(h: &Header) -> Result<Option<Vec<u32>>, DraftError> {
    if h.get(KEY_TOKEN_IDS).is_none() {
        return Ok(None);
    }
    let ids = h.get_i64_array(KEY_TOKEN_IDS)?;
    ids.into_iter()
        .map(|id| {
            u32::try_from(id)
                .map_err(|_| DraftError::BadSlim(format!("token id {id} in {KEY_TOKEN_IDS}")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `model`, loaded from the GGUF whose header is `h`, widened to the whole
/// vocabulary by a [`SlimDraft`] when that GGUF is a slim draft; any other
/// model comes back as it is.
pub fn widen_if_slim(
    h: &Header,
    model: Box<dyn LanguageModel>,
) -> Result<Box<dyn LanguageModel>, DraftError> {
    match slim_token_ids(h)? {
        Some(ids) => Ok(Box::new(SlimDraft::new(model, ids)?)),
        None => Ok(model),
    }
}
