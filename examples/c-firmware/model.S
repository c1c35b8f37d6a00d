/* The model file, linked into flash and used in place by kvm_model_load(). MODEL_FILE is
   a quoted path given by the build (-DMODEL_FILE="\"...\""). Tensor data is 64-byte
   aligned within the file, so the blob starts on a 64-byte boundary too. */
    .section .rodata.kvm_model_blob, "a"
    .balign 64
    .global kvm_model_blob
kvm_model_blob:
    .incbin MODEL_FILE
    .global kvm_model_blob_end
kvm_model_blob_end:
