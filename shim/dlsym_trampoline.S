/* The exported dlsym (DESIGN §2). It asks poolshim_dlsym_intercept whether this lookup is one
   the shim answers (a hooked driver entry point looked up in libcuda.so.1); if not, it jumps
   (not calls) to the C library's dlsym, so that the real dlsym sees the original caller's
   return address: RTLD_NEXT then resolves relative to the caller, exactly as without the
   shim. A C wrapper cannot promise that tail call. x86-64 System V only. */
    .text
    .globl  dlsym
    .type   dlsym, @function
    .p2align 4
dlsym:
    .cfi_startproc
    pushq   %rdi
    .cfi_adjust_cfa_offset 8
    pushq   %rsi
    .cfi_adjust_cfa_offset 8
    subq    $8, %rsp                      /* keep the stack 16-byte aligned at the call */
    .cfi_adjust_cfa_offset 8
    call    poolshim_dlsym_intercept      /* hidden: bound inside the library */
    addq    $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq    %rsi
    .cfi_adjust_cfa_offset -8
    popq    %rdi
    .cfi_adjust_cfa_offset -8
    testq   %rax, %rax
    jnz     1f
    jmp     *poolshim_real_dlsym(%rip)    /* set by the intercept before it returns null */
1:
    ret
    .cfi_endproc
    .size   dlsym, .-dlsym

    .section .note.GNU-stack,"",@progbits
